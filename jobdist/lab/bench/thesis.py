"""`jobdist bench thesis`: the thesis's scenarios on fresh local sites, beside its figures.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ..deployment import DeploymentError, load_deployment
from ..proxy import LinkShape
from ..scenarios import (
    THESIS_SCENARIOS,
    Link,
    Result,
    Scenario,
    check_ledger,
    regions_apart,
    run_scenario,
)
from .common import bench, deployment, in_memory, print_json, servers_kind, topology_option


@dataclass(frozen=True)
class ThesisRow:
    scenario: str
    sites: int
    jobs: int
    steps: int
    targeted: bool  # every step names its site(s)
    makespan: float
    ideal: float  # the true lower bound: steps of a job run one after another
    thesis_optimum: float  # the thesis's formula, 15 s * jobs / workers, scaled
    revisions_min: int
    revisions_max: int
    revisions_per_step: float  # writes after the submission, per step, mean over jobs
    revisions_per_step_max: float
    jobs_ok: int
    problems: list[str]
    thesis: str

    @property
    def ratio_ideal(self) -> float:
        return self.makespan / self.ideal

    @property
    def ratio_thesis(self) -> float:
        return self.makespan / self.thesis_optimum

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"ratio_ideal": self.ratio_ideal,
                               "ratio_thesis": self.ratio_thesis}


def thesis_row(result: Result) -> ThesisRow:
    scenario = result.scenario
    steps = len(scenario.targets)
    per_step = [(revisions - 1) / steps for revisions in result.revisions]
    return ThesisRow(
        scenario=scenario.name, sites=scenario.sites, jobs=scenario.jobs, steps=steps,
        targeted="any" not in scenario.targets,
        makespan=result.makespan, ideal=result.ideal, thesis_optimum=result.thesis_optimum,
        revisions_min=min(result.revisions), revisions_max=max(result.revisions),
        revisions_per_step=statistics.fmean(per_step), revisions_per_step_max=max(per_step),
        jobs_ok=result.statuses.get("success", 0), problems=check_ledger(result),
        thesis=str(scenario.thesis),
    )


def thesis_table(rows: list[ThesisRow], step_seconds: float) -> Table:
    table = Table(title=f"thesis scenarios at {step_seconds} s steps (the thesis: 5 s), "
                        "2 workers a site")
    for column in ("scenario", "makespan", "ideal", "/ideal", "thesis formula", "/formula",
                   "revs/job min/max", "revs/step mean/max", "jobs ok", "thesis (5 s steps)"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row.scenario, f"{row.makespan:.2f} s", f"{row.ideal:.2f} s",
            f"{row.ratio_ideal:.2f}", f"{row.thesis_optimum:.2f} s", f"{row.ratio_thesis:.2f}",
            f"{row.revisions_min}/{row.revisions_max}",
            f"{row.revisions_per_step:.2f}/{row.revisions_per_step_max:.2f}"
            + (" (targeted)" if row.targeted else ""),
            f"{row.jobs_ok}/{row.jobs}", row.thesis,
        )
    return table


def links_option(latency_ms: float | None, jitter_ms: float, bandwidth_kbps: float | None,
                 regions: bool) -> Callable[[Link], LinkShape] | None:
    if regions and latency_ms is not None:
        raise click.UsageError("give --regions or --latency, not both")
    if regions:
        return regions_apart
    if latency_ms is None:
        if jitter_ms or bandwidth_kbps:
            raise click.UsageError("--jitter and --bandwidth go with --latency")
        return None
    shape = LinkShape.parse(latency_ms, jitter_ms, bandwidth_kbps)
    return lambda _: shape


def describe_links(links: Callable[[Link], LinkShape] | None, regions: bool) -> str:
    if links is None:
        return "direct (no added latency)"
    if regions:
        return "regions apart (global-reg_a 40 +- 10 ms, other pairs 120 +- 30 ms, 1 MB/s)"
    shape = links(("global", "reg_a"))
    rate = f", {shape.bandwidth / 1000:g} kB/s" if shape.bandwidth else ""
    return f"{shape.latency * 1000:g} +- {shape.jitter * 1000:g} ms one way{rate}"


def deployment_scenarios(chosen: list[Scenario], shaped: bool) -> list[Scenario]:
    """With `--deployment`, the scenarios it has sites enough for; links as they are."""
    directory = deployment()
    if directory is None:
        return chosen
    if shaped:
        raise DeploymentError("--latency and --regions shape local links through proxies: "
                              "a deployment's links are measured as they are")
    count = len(load_deployment(directory))
    fitting = [scenario for scenario in chosen if scenario.sites <= count]
    if not fitting:
        raise DeploymentError(f"the deployment has {count} sites: no chosen scenario fits")
    return fitting


@bench.command("thesis")
@click.option("--step-seconds", default=1.0, show_default=True,
              help="How long each step sleeps (the thesis used 5).")
@click.option("--only", multiple=True, help="Run only scenarios whose name starts so.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable results.")
@click.option("--latency", "latency_ms", type=click.FloatRange(min=0), default=None,
              metavar="MS", help="Replicate through proxies adding this one-way latency.")
@click.option("--jitter", "jitter_ms", type=click.FloatRange(min=0), default=0.0,
              metavar="MS", help="With --latency: each chunk's latency varies by up to this.")
@click.option("--bandwidth", "bandwidth_kbps", type=click.FloatRange(min=1), default=None,
              metavar="KB/S", help="With --latency: a link carries at most this much a second.")
@click.option("--regions", is_flag=True,
              help="Replicate as the design's regions are apart: global-reg_a 40 ms, the "
                   "other pairs 120 ms one way, jitter, 1 MB/s.")
@topology_option
def thesis_command(step_seconds: float, only: tuple[str, ...], as_json: bool,
                   latency_ms: float | None, jitter_ms: float, bandwidth_kbps: float | None,
                   regions: bool, topology: str) -> None:
    """The thesis's scenarios (section 6), each on fresh local sites, beside its figures."""
    chosen = [s for s in THESIS_SCENARIOS if not only or s.name.startswith(only)]
    if not chosen:
        raise click.ClickException(f"no scenario starts with {' or '.join(only)}")
    links = links_option(latency_ms, jitter_ms, bandwidth_kbps, regions)
    chosen = deployment_scenarios(chosen, links is not None)
    rows = [thesis_row(run_scenario(scenario, step_seconds, links=links,
                                    in_memory=in_memory(), topology=topology,
                                    deployment=deployment()))
            for scenario in chosen]
    if as_json:
        print_json({"step_seconds": step_seconds, "links": describe_links(links, regions),
                    "topology": topology, "servers": servers_kind(),
                    "scenarios": [r.as_json() for r in rows]})
        return
    console = Console()
    console.print(thesis_table(rows, step_seconds))
    console.print(f"replication: {describe_links(links, regions)}, {topology}; "
                  f"servers: {servers_kind()}")
    for row in rows:
        for problem in row.problems:
            console.print(f"[red]problem[/] {row.scenario}: {problem}")
