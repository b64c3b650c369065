"""`jobdist bench targets`: every speed target, each measured, in one run.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import click
from rich.console import Console
from rich.table import Table

from ..scenarios import (
    THESIS_SCENARIOS,
    run_scenario,
)
from .common import bench, in_memory, json_option, print_json, servers_kind
from .memory import Memory, run_memory
from .thesis import thesis_row
from .throughput import Throughput, percentiles_ms, run_throughput


@dataclass(frozen=True)
class Target:
    what: str
    goal: str
    figure: str
    met: bool | None  # None: a figure reported, with no goal to meet


def thesis_targets(step_seconds: float, limit: float, only: tuple[str, ...]) -> list[Target]:
    chosen = [s for s in THESIS_SCENARIOS if not only or s.name.startswith(only)]
    rows = [thesis_row(run_scenario(scenario, step_seconds, in_memory=in_memory()))
            for scenario in chosen]
    return [Target(f"scenario {row.scenario}, {step_seconds:g} s steps: makespan / optimum",
                   f"<= {limit:.2f}", f"{row.ratio_ideal:.3f} ({row.makespan:.2f} s)",
                   row.ratio_ideal <= limit and not row.problems)
            for row in rows]


def latency_targets(r: Throughput) -> list[Target]:
    ms = 1000.0
    p50, p95 = r.remote_latency.get("p50", math.inf), r.remote_latency.get("p95", math.inf)
    return [Target("remote untargeted step, idle workers: submit to start p50", "<= 250 ms",
                   f"{p50 * ms:.0f} ms", p50 <= 0.25),
            Target("remote untargeted step, idle workers: submit to start p95", "<= 500 ms",
                   f"{p95 * ms:.0f} ms", p95 <= 0.5)]


def burst_targets(r: Throughput, census: Throughput) -> list[Target]:
    requests = sum(census.requests.values()) / census.jobs
    ms = 1000.0
    daemon_ms = r.cpu["daemon"] / r.jobs * ms
    return [
        Target(f"throughput, {r.jobs} `{r.command}` jobs, {r.sites} sites x {r.workers} "
               "workers",
               ">= 100 steps/s",
               f"{r.steps_per_s:.1f} steps/s (raw single PUTs {r.raw.single_put_per_s:.0f}/s)",
               r.steps_per_s >= 100),
        Target(f"requests a step ({census.jobs} jobs, every server's log)", "<= 10",
               f"{requests:.1f}", requests <= 10),
        Target("daemon CPU a step (all daemons)", "<= 5 ms", f"{daemon_ms:.1f} ms "
               f"(servers {r.cpu['server'] / r.jobs * ms:.0f} ms)", daemon_ms <= 5),
        Target("submit to start under the burst, p50/p95/p99", "(reported)",
               percentiles_ms(r.latency), None),
    ]


def busy_targets(r: Throughput) -> list[Target]:
    handoff = r.overhead.get("p50", math.inf)
    least = min(r.busy.values(), default=0.0)
    return [
        Target(f"workers busy while work waits ({r.jobs} `{r.command}` jobs), least site",
               ">= 80 %", ", ".join(f"{site} {share:.0%}" for site, share in r.busy.items()),
               least >= 0.8),
        Target("freed worker to the next step's start, p50", "<= 20 ms",
               f"{handoff * 1000:.0f} ms", handoff <= 0.02),
    ]


# Past three sites the star replaces the full mesh (topology.MESH_SITES_MAX).
MANY_SITES_TOPOLOGY = "star"


def run_many_sites(jobs: int) -> dict[int, Throughput]:
    """3, 6 and 9 sites x 2 workers in the star, back to back."""
    return {count: run_throughput(jobs, count, 2, 100, 1800.0, topology=MANY_SITES_TOPOLOGY)
            for count in (3, 6, 9)}


def many_sites_targets(runs: dict[int, Throughput]) -> list[Target]:
    """A step's cost may grow at most linearly with the sites (each stores every job):
    6 sites keep half the 3 sites' throughput and 9 a third, at about the same
    revisions a step."""
    base = runs[3]
    targets = []
    for count, share in ((6, 1 / 2), (9, 1 / 3)):
        r = runs[count]
        ratio = r.steps_per_s / base.steps_per_s
        targets.append(Target(
            f"{count} sites against 3 ({r.topology}, {r.jobs} `{r.command}` jobs, "
            f"{r.workers} workers a site): steps/s", f">= {share:.2f} of 3 sites'",
            f"{ratio:.3f} ({r.steps_per_s:.1f} against {base.steps_per_s:.1f}; "
            f"{r.replicated_per_step:.1f} against {base.replicated_per_step:.1f} "
            "documents replicated a step)", ratio >= share))
        growth = r.revisions_per_step / base.revisions_per_step - 1
        targets.append(Target(
            f"{count} sites against 3: revisions a step", "within 10 %",
            f"{growth:+.0%} ({r.revisions_per_step:.2f} against {base.revisions_per_step:.2f};"
            f" with no conflict {r.revisions_floor:.2f} against {base.revisions_floor:.2f})",
            abs(growth) <= 0.1))
    return targets


MB_PER_MIB = 1.048576


def memory_target(m: Memory) -> Target:
    peak, settled = m.peak_mib * MB_PER_MIB, m.rss_mib * MB_PER_MIB
    return Target(f"daemon peak RSS with {m.jobs} jobs in its database", "< 150 MB",
                  f"{peak:.1f} MB (settled {settled:.1f} MB)", peak < 150)


def targets_table(targets: list[Target]) -> Table:
    table = Table(title="the speed issue's targets, measured in this run")
    for column in ("target", "goal", "measured", "met"):
        table.add_column(column)
    for target in targets:
        met = {True: "yes", False: "[red]no[/]", None: "-"}[target.met]
        table.add_row(target.what, target.goal, target.figure, met)
    return table


def tally(targets: list[Target]) -> str:
    """How many targets were met, of those with a goal."""
    goals = [target for target in targets if target.met is not None]
    met = sum(bool(target.met) for target in goals)
    reported = len(targets) - len(goals)
    return f"{met} of {len(goals)} targets met" + (f" ({reported} reported only)"
                                                  if reported else "")


@bench.command("targets")
@click.option("--burst", default=1000, show_default=True, help="`true` jobs in the burst.")
@click.option("--quick", is_flag=True,
              help="At 5 s steps only scenario 2 on 3 sites, and 10 % of the sizes.")
@json_option
def targets_command(burst: int, quick: bool, as_json: bool) -> None:
    """Every target of the speed issue, measured in one run on fresh local sites: the
    thesis's scenarios at 5 s and 1 s steps, remote start latency with idle workers,
    throughput, requests and CPU a step under a burst, worker use, memory, and how
    throughput and revisions a step hold up at 6 and 9 sites."""
    scale = 0.1 if quick else 1.0
    targets = [*thesis_targets(5.0, 1.02, ("2: 3",) if quick else ()),
               *thesis_targets(1.0, 1.10, ())]
    targets += latency_targets(run_throughput(12, 3, 4, 100, 120.0))
    burst_run = run_throughput(max(12, int(burst * scale)), 3, 4, 500, 1200.0)
    census_run = run_throughput(max(12, int(300 * scale)), 3, 4, 100, 600.0, census=True)
    targets += burst_targets(burst_run, census_run)
    targets += busy_targets(run_throughput(max(24, int(240 * scale)), 3, 4, 100, 600.0,
                                           command="sleep 0.5"))
    targets.append(memory_target(run_memory(int(10_000 * scale), 3, 600.0)))
    targets += many_sites_targets(run_many_sites(max(30, int(burst * scale))))
    if as_json:
        print_json({"servers": servers_kind(), "targets": [asdict(t) for t in targets]})
        return
    Console().print(targets_table(targets))
    click.echo(f"{tally(targets)}; servers: {servers_kind()}")
