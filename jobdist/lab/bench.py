"""`jobdist bench`: our speed against the thesis's figures and the server's own limits.

Every benchmark starts fresh local sites (pouchdb-server keeping its data on
disk, as `jobdist cluster up` runs it, unless `jobdist bench --in-memory`; one
daemon per site) in a temporary directory and stops them afterwards. Figures
that depend on this machine's load are also given as ratios measured in the
same run (against the ideal makespan, the same server's raw write rate, the
thesis's estimate), so they can be compared across runs. docs/performance.md
says what each figure means, what bounds it and how it was measured.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import requests
from rich.console import Console
from rich.table import Table

from .. import core
from ..clock import seconds_between, utc_now
from ..config import CouchSettings
from ..couch import Couch, Database
from ..couch_changes import changes
from ..couch_sync import sync_design_docs
from ..design import load_design_docs
from ..model import Doc, new_job, new_step, normalise
from ..setup import admin_couch_of
from ..status import status_id
from ..step_run import StepResult
from .cluster import LocalCluster
from .faults import SEED_VARIABLE, fault_seed, fault_table, soak
from .localserver import LocalServer, free_port
from .proxy import LinkShape
from .scenarios import (
    THESIS_SCENARIOS,
    Link,
    Result,
    check_ledger,
    regions_apart,
    run_scenario,
    site_db,
    submit_all,
    wait_until_done,
    write_sites,
)

TOPOLOGIES = ("mesh", "star", "filtered")
REPLICATOR_AGENT = "node-fetch"  # pouchdb-server's replicator; our daemons send python-requests
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
REVISIONS_BATCH = 500  # leaves a `_bulk_get` of count_revisions reads at once


@dataclass(frozen=True)
class BenchOptions:
    in_memory: bool = False  # servers that keep nothing on disk: no user runs them so


@click.group("bench")
@click.option("--in-memory", is_flag=True,
              help="Servers keep nothing on disk (the default is on disk, as users run them).")
@click.pass_context
def bench(ctx: click.Context, in_memory: bool) -> None:
    """Benchmarks against the thesis's figures and the local server's own limits."""
    ctx.obj = BenchOptions(in_memory)


def in_memory() -> bool:
    """Were in-memory servers asked for (`jobdist bench --in-memory`)?"""
    ctx = click.get_current_context(silent=True)
    options = ctx.find_object(BenchOptions) if ctx is not None else None
    return options is not None and options.in_memory


def servers_kind() -> str:
    """What every report says of the servers it measured."""
    return "pouchdb-server " + ("in memory" if in_memory() else "on disk")


# --- shared helpers -------------------------------------------------------------------


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile: a value that was really measured."""
    ordered = sorted(values)
    rank = max(1, round(pct / 100 * len(ordered) + 0.5 - 1e-9))
    return ordered[min(rank, len(ordered)) - 1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak) of a live process, in KiB."""
    wanted = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            wanted[key] = int(value.split()[0])
    return wanted


def cluster_pids(cluster: LocalCluster) -> dict[str, list[int]]:
    """The pids of the pouchdb-servers (not their supervisors) and of the daemons."""
    return {"server": [cluster.server_pid(name) for name in cluster.sites],
            "daemon": [cluster.daemon_proc(name).pid for name in cluster.sites]}


def write_site_configs(directory: Path, count: int, workers: int,
                       topology: str = "mesh", keepalive: float = 5.0) -> Path:
    """write_sites for a benchmark: its topology and keep-alive period."""
    return write_sites(directory, count, workers, keepalive, topology=topology)


@contextlib.contextmanager
def local_cluster(count: int, workers: int, topology: str = "mesh",
                  keepalive: float = 5.0) -> Iterator[LocalCluster]:
    """Fresh sites in a temporary directory, always stopped afterwards."""
    with tempfile.TemporaryDirectory(prefix="jobdist-bench-") as tmp:
        root = Path(tmp)
        sites = write_site_configs(root / "sites", count, workers, topology, keepalive)
        with LocalCluster(sites, root / "state", in_memory=in_memory()) as cluster:
            yield cluster


def print_json(payload: Any) -> None:
    click.echo(json.dumps(payload, indent=2))


# --- request logs: what each server was asked, and by whom ---------------------------


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    agent: str
    body_bytes: int


# A debug entry: "[date] [debug] [<pid>] 'POST' /jobs/_bulk_docs {1,1} from "ip"", then
# "Headers: [{'Name', value},", one header a line, no closing bracket; the next entry
# starts with "[Sun, 22 Nov ...".
_DEBUG_ENTRY = re.compile(r"\[debug\] \[<[^>]*>\] '(\w+)' (\S+) \{1,1\} from [^\n]*\n"
                          r"Headers: \[(.*?)\n(?=\[\w{3}, |\Z)", re.DOTALL)
_HEADER = re.compile(r"\{'([^']+)', ([^}]*)\}")


class ServerLog:
    """pouchdb-server's log.txt at debug level: one entry per request, headers included.

    The User-Agent tells the replicator (node-fetch) from our daemons
    (python-requests); Content-Length is the request body. Responses are
    not logged, so `_changes` and `_bulk_get` answers are not in the bytes.
    """

    def __init__(self, server_url: str, path: Path,
                 admin: tuple[str, str] | None = None) -> None:
        self.path = path
        requests.put(f"{server_url}/_config/log/level", json="debug", auth=admin,
                     timeout=10).raise_for_status()
        self.offset = path.stat().st_size if path.exists() else 0

    def requests_since_start(self) -> list[Request]:
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            return parse_requests(handle.read().decode("utf-8", errors="replace"))


def parse_requests(text: str) -> list[Request]:
    found = []
    for method, path, headers in _DEBUG_ENTRY.findall(text):
        fields = {k.lower(): v.strip() for k, v in _HEADER.findall(headers)}
        length = fields.get("content-length", "0")
        found.append(Request(method, path, fields.get("user-agent", ""),
                             int(length) if length.isdigit() else 0))
    return found


def request_kind(request: Request) -> str:
    """Who sent a request and what it was, with document ids and checkpoints folded."""
    # Everything not the replicator is python-requests: the daemons and the bench's own polls.
    who = "replicator" if request.agent.startswith(REPLICATOR_AGENT) else "jobdist"
    path, _, query = request.path.partition("?")
    parts = path.split("/")
    if len(parts) > 2 and not parts[2].startswith("_"):
        parts[2] = "{doc}" + (" open_revs" if "open_revs" in query else "")
    elif len(parts) > 3 and parts[2] == "_local":
        parts[3:] = ["{local}"]
    elif parts[-1] == "_changes":
        feed = re.search(r"feed=(\w+)", query)
        parts[-1] += f" feed={feed.group(1) if feed else 'normal'}"
    return f"{who} {request.method} {'/'.join(parts)}"


def request_census(logs: list[ServerLog]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for log in logs:
        for request in log.requests_since_start():
            kind = request_kind(request)
            counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


# --- bench thesis ----------------------------------------------------------------------


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
def thesis_command(step_seconds: float, only: tuple[str, ...], as_json: bool,
                   latency_ms: float | None, jitter_ms: float, bandwidth_kbps: float | None,
                   regions: bool) -> None:
    """The thesis's scenarios (section 6), each on fresh local sites, beside its figures."""
    chosen = [s for s in THESIS_SCENARIOS if not only or s.name.startswith(only)]
    if not chosen:
        raise click.ClickException(f"no scenario starts with {' or '.join(only)}")
    links = links_option(latency_ms, jitter_ms, bandwidth_kbps, regions)
    rows = [thesis_row(run_scenario(scenario, step_seconds, links=links,
                                    in_memory=in_memory()))
            for scenario in chosen]
    if as_json:
        print_json({"step_seconds": step_seconds, "links": describe_links(links, regions),
                    "servers": servers_kind(), "scenarios": [r.as_json() for r in rows]})
        return
    console = Console()
    console.print(thesis_table(rows, step_seconds))
    console.print(f"replication: {describe_links(links, regions)}; servers: {servers_kind()}")
    for row in rows:
        for problem in row.problems:
            console.print(f"[red]problem[/] {row.scenario}: {problem}")


# --- bench throughput -------------------------------------------------------------------


@dataclass(frozen=True)
class RawRates:
    """What the server itself sustains: docs per second, one PUT each and in one _bulk_docs."""

    docs: int
    single_put_per_s: float
    bulk_docs_per_s: float


def raw_write_rates(couch: Couch, docs: int) -> RawRates:
    """Write job-shaped documents into a fresh database with our design documents."""
    db = couch.ensure_database(f"bench_raw_{uuid.uuid4().hex[:8]}")
    try:
        sync_design_docs(db, load_design_docs())  # the same validation the jobs database runs
        singles = [new_job("global", [new_step("true")]) for _ in range(docs)]
        started = time.perf_counter()
        for doc in singles:
            db.save(doc)
        single_rate = docs / (time.perf_counter() - started)
        batch = [new_job("global", [new_step("true")]) for _ in range(docs)]
        started = time.perf_counter()
        db.bulk_docs(batch)
        bulk_rate = docs / (time.perf_counter() - started)
    finally:
        couch.call(f"delete {db.url}", couch.client.delete_database, db.name)
    return RawRates(docs, single_rate, bulk_rate)


@dataclass(frozen=True)
class Revisions:
    """Every revision of some documents: the winning branches, conflicts and deletions."""

    total: int  # distinct revisions in the revision trees, creations included
    conflict_leaves: int  # leaves beside the winner, live or deleted


def revision_trees(db: Database, ids: list[str]) -> dict[str, tuple[set[str], int]]:
    """For each of some documents: the ids of every revision in its tree, and how many
    leaves it has (a document this database lacks is left out).

    One `_changes` with `style=all_docs` names every leaf, deleted ones included (the
    SDK has no `open_revs`); `_bulk_get` with `revs` brings their histories, in batches.
    (A `_changes` filtered by id for each document read the whole feed each time: a
    4,000-job run spent minutes counting.)
    """
    client = db.couch.client
    wanted_ids = set(ids)
    feed = db.couch.call("list the leaves", client.post_changes, db.name, style="all_docs")
    # (A clustered CouchDB may list a document twice: each leaf once.)
    wanted = [{"id": doc_id, "rev": rev} for doc_id, rev in dict.fromkeys(
        (result["id"], change["rev"]) for result in feed["results"]
        if result["id"] in wanted_ids for change in result["changes"])]
    trees: dict[str, tuple[set[str], int]] = {}
    for first in range(0, len(wanted), REVISIONS_BATCH):
        answer = db.couch.call("read the leaves", client.post_bulk_get, db.name,
                               docs=wanted[first:first + REVISIONS_BATCH], revs=True)
        for result in answer["results"]:
            for item in result["docs"]:
                if "ok" in item:
                    revs, leaves = trees.setdefault(result["id"], (set(), 0))
                    trees[result["id"]] = (revs | history_revs(item["ok"]), leaves + 1)
    return trees


def history_revs(leaf: Doc) -> set[str]:
    history = leaf.get("_revisions") or {}
    start = history.get("start", 0)
    return {f"{start - i}-{rev}" for i, rev in enumerate(history.get("ids", []))}


def count_revisions(db: Database, ids: list[str]) -> Revisions:
    trees = revision_trees(db, ids).values()
    return Revisions(sum(len(revs) for revs, _ in trees),
                     sum(leaves - 1 for _, leaves in trees))


def scheduling_overheads(docs: list[Doc], since: str) -> list[float]:
    """Per step: its start minus when both it was runnable and its worker was free.

    A worker is free from the end of its previous step (or from `since`, when
    the sites were ready); the step is runnable from its job's creation. What
    remains is the time the protocol took: feeds, claims, replication, writes.
    """
    starts = sorted(
        (step["start_time"], step["winner"], step["executioner"], step["finish_time"],
         doc["created_at"])
        for doc in docs for step in doc["job"][:1] if step.get("start_time"))
    free_since: dict[tuple[str, str], str] = {}
    overheads = []
    for start, site, worker, finish, created in starts:
        free = free_since.get((site, worker), since)
        overheads.append(seconds_between(max(created, free), start))
        free_since[(site, worker)] = finish
    return overheads


@dataclass(frozen=True)
class Throughput:
    jobs: int
    command: str  # each job's single step
    sites: int
    workers: int
    wall: float  # submission until every job is seen done at the submitting site
    execution_window: float  # first creation to last step's end, from the documents
    latency: dict[str, float]  # submit-to-start, seconds
    remote_latency: dict[str, float]  # the same, of the steps that ran away from global
    overhead: dict[str, float]  # scheduling overhead, seconds (see scheduling_overheads)
    busy: dict[str, float]  # each site's share of worker time busy while work waited
    revisions_per_step: float  # writes per step after the submission, conflicts included
    conflict_leaves: int
    raw: RawRates
    cpu: dict[str, float]  # CPU seconds during the run, by role
    jobs_ok: int
    requests: dict[str, int]  # by sender and kind, when asked for (see ServerLog)

    @property
    def steps_per_s(self) -> float:
        return self.jobs / self.wall

    @property
    def writes_per_s(self) -> float:
        """Writes the jobs caused, submissions included, per second of wall time."""
        return self.jobs * (self.revisions_per_step + 1) / self.wall

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"steps_per_s": self.steps_per_s,
                               "writes_per_s": self.writes_per_s,
                               "steps_per_s_in_window": self.jobs / self.execution_window,
                               "writes_per_s_vs_single_put": self.writes_per_s
                               / self.raw.single_put_per_s}


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"p50": percentile(values, 50), "p95": percentile(values, 95),
            "p99": percentile(values, 99), "max": max(values)}


def busy_shares(docs: list[Doc], workers: int) -> dict[str, float]:
    """Each site's busy worker-seconds over what its workers could give while work
    waited: from the first step's start to the last one's (after it, nothing waits)."""
    steps = [step for doc in docs for step in doc["job"] if step.get("start_time")]
    if not steps:
        return {}
    first = min(step["start_time"] for step in steps)
    last = max(step["start_time"] for step in steps)
    window = seconds_between(first, last)
    busy: dict[str, float] = {}
    for step in steps:  # ISO 8601 UTC times, all alike: they compare as strings
        start, end = step["start_time"], min(step.get("finish_time") or last, last)
        used = seconds_between(start, end) if end > start else 0.0
        busy[step["winner"]] = busy.get(step["winner"], 0.0) + used
    return {site: (used / (workers * window) if window > 0 else 0.0)
            for site, used in sorted(busy.items())}


def server_logs(cluster: LocalCluster) -> list[ServerLog]:
    return [ServerLog(site.couch.url, cluster.site_dir(name) / "couch" / "log.txt",
                      admin_login(site.couch)) for name, site in cluster.sites.items()]


def admin_login(couch: CouchSettings) -> tuple[str, str] | None:
    return (couch.admin_user, couch.admin_password or "") if couch.admin_user else None


def run_throughput(jobs: int, sites: int, workers: int, raw_docs: int,
                   timeout: float, census: bool = False, command: str = "true") -> Throughput:
    with local_cluster(sites, workers) as cluster:
        db = site_db(cluster, "global")
        raw = raw_write_rates(admin_couch_of(cluster.sites["global"]), raw_docs)
        logs = server_logs(cluster) if census else []
        pids = cluster_pids(cluster)
        cpu_before = {role: sum(map(cpu_seconds, p)) for role, p in pids.items()}
        ready = utc_now()
        started = time.monotonic()
        ids = submit_all(db, "global", [new_step(command)], jobs)
        docs = wait_until_done(db, ids, timeout)
        wall = time.monotonic() - started
        cpu = {role: sum(map(cpu_seconds, p)) - cpu_before[role] for role, p in pids.items()}
        requests = request_census(logs)
        revisions = count_revisions(db, ids)
    return Throughput(
        jobs=jobs, command=command, sites=sites, workers=workers, wall=wall,
        execution_window=seconds_between(
            min(d["created_at"] for d in docs),
            max(d["job"][0]["finish_time"] for d in docs)),
        latency=summary([submit_to_start(d) for d in docs]),
        remote_latency=summary([submit_to_start(d) for d in docs
                                if d["job"][0]["winner"] != "global"]),
        overhead=summary(scheduling_overheads(docs, ready)),
        busy=busy_shares(docs, workers),
        revisions_per_step=(revisions.total - jobs) / jobs,
        conflict_leaves=revisions.conflict_leaves,
        raw=raw, cpu=cpu | {"wall": wall},
        jobs_ok=sum(d["job_status"] == "success" for d in docs),
        requests=requests,
    )


def percentiles_ms(spread: dict[str, float]) -> str:
    """A summary's p50/p95/p99 in milliseconds, as the tables show it."""
    return "/".join(f"{spread[p] * 1000:.0f}" for p in ("p50", "p95", "p99")) + " ms"


def submit_to_start(doc: Doc) -> float:
    return seconds_between(doc["created_at"], doc["job"][0]["start_time"])


def measures_table(title: str, rows: list[tuple[str, str]]) -> Table:
    """A two-column table: what was measured, and its value."""
    table = Table(title=title)
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, value)
    return table


def throughput_table(r: Throughput) -> Table:
    title = (f"{r.jobs} single-step `{r.command}` jobs, {r.sites} sites x {r.workers} "
             "workers, submitted at once at global")
    ms = 1000.0
    rows = [
        ("steps/s (until all seen done at global)", f"{r.steps_per_s:.1f}"),
        ("steps/s (first creation to last step end)",
         f"{r.jobs / r.execution_window:.1f}"),
        ("submit-to-start p50/p95/p99", percentiles_ms(r.latency)),
        ("  of steps run away from global",
         percentiles_ms(r.remote_latency) if r.remote_latency else "none"),
        ("scheduling overhead p50/p95/p99", percentiles_ms(r.overhead)),
        ("writes per step (after submission)", f"{r.revisions_per_step:.2f}"),
        ("conflict leaves (all jobs)", str(r.conflict_leaves)),
        ("writes/s caused by the jobs", f"{r.writes_per_s:.1f}"),
        (f"raw single PUTs/s ({r.raw.docs} docs, same server)",
         f"{r.raw.single_put_per_s:.1f}"),
        (f"raw _bulk_docs docs/s ({r.raw.docs} docs)", f"{r.raw.bulk_docs_per_s:.1f}"),
        ("job writes/s / raw single PUTs/s",
         f"{r.writes_per_s / r.raw.single_put_per_s:.2f}"),
        ("CPU s: servers / daemons / wall",
         f"{r.cpu['server']:.1f} / {r.cpu['daemon']:.1f} / {r.cpu['wall']:.1f}"),
        ("CPU ms a step: servers / daemons",
         f"{r.cpu['server'] / r.jobs * ms:.1f} / {r.cpu['daemon'] / r.jobs * ms:.1f}"),
        ("workers busy while work waited", ", ".join(
            f"{site} {share:.0%}" for site, share in r.busy.items())),
        ("jobs ok", f"{r.jobs_ok}/{r.jobs}"),
    ]
    return measures_table(title, rows)


sites_option = click.option("--sites", default=3, show_default=True, help="Sites in a full mesh.")
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print machine-readable results.")


def workers_option(default: int) -> Any:
    return click.option("--workers", default=default, show_default=True, help="Workers a site.")


def timeout_option(default: float) -> Any:
    return click.option("--timeout", default=default, show_default=True,
                        help="Seconds to wait for jobs.")


@bench.command("throughput")
@click.option("--jobs", default=500, show_default=True, help="Single-step jobs to submit.")
@sites_option
@workers_option(4)
@click.option("--raw-writes", default=500, show_default=True,
              help="Documents for the server's raw write rate.")
@timeout_option(600.0)
@click.option("--requests", "census", is_flag=True,
              help="Also count the servers' requests by sender and kind (debug logs: slower).")
@click.option("--command", default="true", show_default=True, help="Each job's one step.")
@json_option
def throughput_command(jobs: int, sites: int, workers: int, raw_writes: int, timeout: float,
                       census: bool, command: str, as_json: bool) -> None:
    """Steps per second, scheduling latency and writes per step, beside the raw write rate."""
    result = run_throughput(jobs, sites, workers, raw_writes, timeout, census, command)
    if as_json:
        print_json(result.as_json() | {"servers": servers_kind()})
        return
    console = Console()
    console.print(throughput_table(result))
    console.print(f"servers: {servers_kind()}")
    if census:
        console.print(census_table(result.requests, result.jobs))


def census_table(counts: dict[str, int], steps: int) -> Table:
    table = Table(title=f"requests to all servers, per step ({sum(counts.values())} in all)")
    table.add_column("sender and request")
    table.add_column("per step", justify="right")
    for kind, count in counts.items():
        table.add_row(kind, f"{count / steps:.2f}")
    table.add_row("all", f"{sum(counts.values()) / steps:.2f}")
    return table


# --- bench replication ----------------------------------------------------------------------


def parse_site_range(text: str) -> list[int]:
    """"2..5" -> [2, 3, 4, 5]; "3" -> [3]; "2,4" -> [2, 4]."""
    try:
        if ".." in text:
            low, high = (int(part) for part in text.split("..", 1))
            counts = list(range(low, high + 1))
        else:
            counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"{text!r}: use N, N..M or N,M,...") from None
    if not counts or min(counts) < 2:
        raise click.BadParameter(f"{text!r}: replication needs at least 2 sites")
    return counts


@dataclass(frozen=True)
class ReplicationRow:
    topology: str
    sites: int
    jobs: int
    steps: int
    revisions_per_job: float  # distinct revisions written at their origin, per job
    status_writes_per_job: float  # the sites' own status documents written meanwhile
    # Job revisions written into a site by replication, per job: every revision the
    # replicators wrote, less the most the status documents can account for.
    replicated_per_job: float
    replication_requests_per_job: float
    replication_kib_per_job: float  # request bodies the replicators sent
    makespan: float

    @property
    def replicated_per_step(self) -> float:
        return self.replicated_per_job / self.steps

    @property
    def thesis_per_step(self) -> int:
        """The thesis's 4.3 estimate for a full mesh: 4 (N - 1)^2 documents per step."""
        return 4 * (self.sites - 1) ** 2

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"replicated_per_step": self.replicated_per_step,
                               "thesis_per_step": self.thesis_per_step}


def replication_jobs(sites: list[str], count: int, step_seconds: float) -> list[list[Doc]]:
    """Half the jobs may run anywhere, half are bound to one site (round robin)."""
    command = f"sleep {step_seconds}"
    jobs = []
    for index in range(count):
        target = "any" if index % 2 == 0 else sites[(index // 2) % len(sites)]
        jobs.append([new_step(command, target=target) for _ in range(3)])
    return jobs


def status_writes(dbs: dict[str, Database]) -> int:
    """Revisions of the sites' status documents, each counted at its own site."""
    total = 0
    for name, db in dbs.items():
        doc = db.get(status_id(name))
        total += int(doc["_rev"].split("-")[0]) if doc else 0
    return total


def update_seqs(dbs: dict[str, Database]) -> dict[str, int]:
    # pouchdb-server's seqs are integers: one per revision written, _local docs excluded.
    return {name: int(db.info()["update_seq"]) for name, db in dbs.items()}


def wait_until_quiet(dbs: dict[str, Database], quiet: float = 1.5,
                     timeout: float = 60.0) -> dict[str, int]:
    """The update seqs once no site has written anything for `quiet` seconds."""
    deadline = time.monotonic() + timeout
    last, since = update_seqs(dbs), time.monotonic()
    while time.monotonic() - since < quiet and time.monotonic() < deadline:
        time.sleep(0.25)
        now = update_seqs(dbs)
        if now != last:
            last, since = now, time.monotonic()
    return last


def distinct_revisions(dbs: dict[str, Database], ids: list[str]) -> int:
    """Revisions in the union of every site's trees: each was written once, at its origin."""
    union: dict[str, set[str]] = {}
    for db in dbs.values():
        for doc_id, (revs, _) in revision_trees(db, ids).items():
            union.setdefault(doc_id, set()).update(revs)
    return sum(len(revs) for revs in union.values())


def submit_jobs(db: Database, jobs: list[list[Doc]]) -> list[str]:
    docs = [new_job("global", steps) for steps in jobs]
    db.bulk_docs(docs)
    return [doc["_id"] for doc in docs]


def run_replication(topology: str, count: int, jobs: int, step_seconds: float,
                    workers: int) -> ReplicationRow:
    with local_cluster(count, workers, topology) as cluster:
        dbs = {name: site_db(cluster, name) for name in cluster.sites}
        logs = server_logs(cluster)
        statuses_before = status_writes(dbs)
        before = update_seqs(dbs)
        started = time.monotonic()
        ids = submit_jobs(dbs["global"], replication_jobs(list(cluster.sites), jobs,
                                                          step_seconds))
        wait_until_done(dbs["global"], ids, timeout=300)
        makespan = time.monotonic() - started
        after = wait_until_quiet(dbs)
        statuses = status_writes(dbs) - statuses_before
        revisions = distinct_revisions(dbs, ids)
        replicator = [r for log in logs for r in log.requests_since_start()
                      if r.agent.startswith(REPLICATOR_AGENT)]
    # Status documents replicate too; each of their revisions reaches a site at most
    # once, so at most `count - 1` of the replicated ones are theirs, per revision.
    written = sum(after.values()) - sum(before.values())
    status_replicated = min(statuses * (count - 1), written - revisions - statuses)
    return ReplicationRow(
        topology=topology, sites=count, jobs=jobs, steps=3,
        revisions_per_job=revisions / jobs,
        status_writes_per_job=statuses / jobs,
        replicated_per_job=(written - revisions - statuses - status_replicated) / jobs,
        replication_requests_per_job=len(replicator) / jobs,
        replication_kib_per_job=sum(r.body_bytes for r in replicator) / 1024 / jobs,
        makespan=makespan,
    )


def replication_table(topology: str, rows: list[ReplicationRow]) -> Table:
    table = Table(title=f"replication, {topology}: documents written by replication "
                        "(the thesis's 4.3 estimate: 4(N-1)^2 a step, full mesh)")
    for column in ("sites", "revs/job", "status writes/job", "replicated/job", "replicated/step",
                   "thesis/step", "measured/thesis", "repl. requests/job",
                   "repl. KiB sent/job", "makespan"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            str(row.sites), f"{row.revisions_per_job:.1f}", f"{row.status_writes_per_job:.1f}",
            f"{row.replicated_per_job:.1f}",
            f"{row.replicated_per_step:.1f}", str(row.thesis_per_step),
            f"{row.replicated_per_step / row.thesis_per_step:.2f}",
            f"{row.replication_requests_per_job:.1f}", f"{row.replication_kib_per_job:.1f}",
            f"{row.makespan:.1f} s",
        )
    return table


@bench.command("replication")
@click.option("--sites", "site_range", default="2..5", show_default=True,
              help="Site counts: N, N..M or N,M,...")
@click.option("--topology", "topologies", multiple=True, type=click.Choice(TOPOLOGIES),
              help="Repeat for several; default: all three.")
@click.option("--jobs", default=12, show_default=True,
              help="3-step jobs: half run anywhere, half on one site.")
@click.option("--step-seconds", default=0.2, show_default=True)
@click.option("--workers", default=2, show_default=True, help="Workers a site.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable results.")
def replication_command(site_range: str, topologies: tuple[str, ...], jobs: int,
                        step_seconds: float, workers: int, as_json: bool) -> None:
    """Documents moved by replication per job as the number of sites grows."""
    counts = parse_site_range(site_range)
    results = {topology: [run_replication(topology, count, jobs, step_seconds, workers)
                          for count in counts]
               for topology in topologies or TOPOLOGIES}
    if as_json:
        print_json({t: [row.as_json() for row in rows] for t, rows in results.items()})
        return
    console = Console()
    for topology, rows in results.items():
        console.print(replication_table(topology, rows))


# --- bench priorities -----------------------------------------------------------------------


@dataclass(frozen=True)
class Priorities:
    """Low-priority jobs under a constant stream of higher-priority ones (core.claim_rank)."""

    sites: int
    workers: int
    step_seconds: float
    rate: float  # high-priority jobs submitted per second, for `duration` seconds
    duration: float
    high_priority: int
    high_jobs: int
    low_waits: list[float]  # creation to start, each low-priority job
    high_waits: dict[str, float]
    low_done_during_stream: int  # low jobs that finished while high ones kept coming
    stream_ended_at: float  # seconds after the first submission
    bound: float  # (high_priority + 1) * AGING_SECONDS + the longest high-priority wait

    @property
    def low(self) -> dict[str, float]:
        return summary(self.low_waits)

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"low": self.low}


def low_submission_times(low: int, duration: float) -> list[float]:
    """When the low-priority jobs go in: spread over the stream's first 40 %, so that
    each has time to reach the front while high-priority jobs still arrive."""
    return [duration * 0.4 * (n + 1) / (low + 1) for n in range(low)]


def run_priorities(sites: int, workers: int, step_seconds: float, rate: float,
                   duration: float, low: int, high_priority: int,
                   timeout: float) -> Priorities:
    with local_cluster(sites, workers) as cluster:
        dbs = [site_db(cluster, name) for name in cluster.sites]
        creators = list(cluster.sites)
        step = [new_step(f"sleep {step_seconds}")]
        low_due = low_submission_times(low, duration)
        high_ids: list[str] = []
        low_ids: list[str] = []
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < duration:
            if low_due and elapsed >= low_due[0]:
                low_due.pop(0)
                job = new_job(creators[len(low_ids) % sites], step, priority=0)
                dbs[len(low_ids) % sites].save(job)
                low_ids.append(job["_id"])
            if len(high_ids) < elapsed * rate:  # round robin over the creators
                n = len(high_ids) % sites
                job = new_job(creators[n], step, priority=high_priority)
                dbs[n].save(job)
                high_ids.append(job["_id"])
            time.sleep(0.01)
        stream_end = utc_now()
        docs = wait_until_done(dbs[0], low_ids + high_ids, timeout)
    low_docs, high_docs = docs[:len(low_ids)], docs[len(low_ids):]

    def waits(chosen: list[Doc]) -> list[float]:
        return [seconds_between(d["created_at"], d["job"][0]["start_time"]) for d in chosen]

    high_waits = waits(high_docs)
    return Priorities(
        sites=sites, workers=workers, step_seconds=step_seconds, rate=rate, duration=duration,
        high_priority=high_priority, high_jobs=len(high_ids), low_waits=waits(low_docs),
        high_waits=summary(high_waits),
        low_done_during_stream=sum(d["job"][0]["finish_time"] <= stream_end for d in low_docs),
        stream_ended_at=duration,
        bound=(high_priority + 1) * core.AGING_SECONDS + max(high_waits))


def priorities_table(r: Priorities) -> Table:
    title = (f"{len(r.low_waits)} priority-0 jobs among {r.high_jobs} of priority "
             f"{r.high_priority} ({r.rate:g}/s for {r.duration:g} s), "
             f"{r.sites} sites x {r.workers} workers, `sleep {r.step_seconds:g}`")
    return measures_table(title, [
        ("priority-0 wait p50 / max", f"{r.low['p50']:.1f} / {r.low['max']:.1f} s"),
        (f"priority-{r.high_priority} wait p50 / max",
         f"{r.high_waits['p50']:.1f} / {r.high_waits['max']:.1f} s"),
        ("bound: (priority gap + 1) x 10 s + longest high wait", f"{r.bound:.1f} s"),
        ("priority-0 jobs done while the stream still ran",
         f"{r.low_done_during_stream}/{len(r.low_waits)}"),
    ])


@bench.command("priorities")
@sites_option
@workers_option(2)
@click.option("--step-seconds", default=1.0, show_default=True, help="Each job's `sleep`.")
@click.option("--rate", default=3.0, show_default=True,
              help="High-priority jobs submitted per second (more than the sites can run).")
@click.option("--duration", default=50.0, show_default=True,
              help="Seconds the high-priority stream lasts.")
@click.option("--low", default=5, show_default=True,
              help="Priority-0 jobs, submitted during the stream's first 40 %.")
@click.option("--high-priority", default=1, show_default=True)
@timeout_option(300.0)
@json_option
def priorities_command(sites: int, workers: int, step_seconds: float, rate: float,
                       duration: float, low: int, high_priority: int, timeout: float,
                       as_json: bool) -> None:
    """Low-priority waits under a constant stream of higher-priority jobs: bounded, not
    starved (core.claim_rank)."""
    result = run_priorities(sites, workers, step_seconds, rate, duration, low, high_priority,
                            timeout)
    if as_json:
        print_json(result.as_json())
        return
    Console().print(priorities_table(result))


# --- bench memory ---------------------------------------------------------------------------


def finished_job(creator: str, steps: int) -> Doc:
    """A job as it looks once every step ran: history, times and outputs filled in."""
    doc = new_job(creator, [new_step("true") for _ in range(steps)])
    now = doc["created_at"]
    ctx = core.Context(creator, now)
    outcome = StepResult(ok=True, used_alt=False, exit_code=0, attempts=1, exec_time=0.01,
                         start_time=now, finish_time=now, stdout="", stderr="",
                         reason="exit 0")
    job = normalise(doc)  # a new job is complete: `doc` itself
    for _ in range(steps):
        core.start(ctx, f"{creator}/w0", assign=True)(job)
        core.record_outcome(ctx, f"{creator}/w0", outcome)(job)
    return doc


def fill(db: Database, count: int, steps: int, chunk: int = 500) -> None:
    for start in range(0, count, chunk):
        db.bulk_docs([finished_job("global", steps) for _ in range(min(chunk, count - start))])


def wait_caught_up(db: Database, site: str, pid: int, seq: int, timeout: float) -> float:
    """Seconds until the daemon has read the whole feed.

    Its checkpoint (saved every 2 s) reaching `seq` proves it; but the
    checkpoint may stop short of the last change (see docs/performance.md),
    so a checkpointed daemon idle for 2 s (under 2% of a core) counts too:
    finished jobs give it nothing else to do.
    """
    started = time.monotonic()
    idle_since, cpu = started, cpu_seconds(pid)
    while time.monotonic() - started < timeout:
        time.sleep(0.25)
        saved = db.get_local(f"jobdist-checkpoint-{site}")
        now, used = time.monotonic(), cpu_seconds(pid)
        if used - cpu > 0.005:
            idle_since, cpu = now, used
        if saved is not None and (int(saved["seq"]) >= seq or now - idle_since >= 2.0):
            return idle_since - started
    raise click.ClickException(f"the daemon did not read {seq} changes in {timeout} s")


@dataclass(frozen=True)
class Memory:
    jobs: int
    ready_s: float  # restart until the daemon said it was ready
    caught_up_s: float  # ready until its checkpoint passed every job
    rss_mib: float  # once caught up
    peak_mib: float  # VmHWM: the most it ever held

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def run_memory(jobs: int, steps: int, timeout: float) -> Memory:
    with local_cluster(1, 2) as cluster:
        db = site_db(cluster, "global")
        cluster.daemon_proc("global").stop()
        fill(db, jobs, steps)
        seq = int(str(db.last_seq()))  # pouchdb-server: a number
        started = time.monotonic()
        cluster.start_daemon("global")  # a restart reads the whole feed and recovers
        ready = time.monotonic() - started
        pid = cluster.daemon_proc("global").pid
        caught_up = wait_caught_up(db, "global", pid, seq, timeout)
        memory = memory_kib(pid)
    return Memory(jobs, ready, caught_up, memory["VmRSS"] / 1024, memory["VmHWM"] / 1024)


@bench.command("memory")
@click.option("--jobs", default=10_000, show_default=True, help="Finished jobs to pre-fill.")
@click.option("--steps", default=3, show_default=True, help="Steps per job.")
@click.option("--timeout", default=600.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable results.")
def memory_command(jobs: int, steps: int, timeout: float, as_json: bool) -> None:
    """A daemon's memory after a restart on a database of finished jobs."""
    result = run_memory(jobs, steps, timeout)
    if as_json:
        print_json(result.as_json())
        return
    table = Table(title=f"one site daemon restarted on {jobs} finished {steps}-step jobs")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("restart to ready", f"{result.ready_s:.1f} s")
    table.add_row("ready to feed caught up", f"{result.caught_up_s:.1f} s")
    table.add_row("RSS once caught up", f"{result.rss_mib:.1f} MiB")
    table.add_row("peak RSS (VmHWM)", f"{result.peak_mib:.1f} MiB")
    Console().print(table)


# --- bench feed -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FeedRun:
    """One way of following `_changes`: how soon it saw writes, and what that cost."""

    name: str
    idle_ms: dict[str, float]  # write answered -> change seen, one write at a time
    burst_s: float  # a bulk write of `burst` documents -> the last one seen
    cpu_ms_per_change: float  # this process's CPU over the burst (the write included)
    requests: int  # requests the follower made, over the whole run

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class FeedProbe:
    """Follows a database's changes in a thread and notes when each id arrived."""

    def __init__(self, follow: Iterator[str]) -> None:
        self.follow = follow
        self.seen: dict[str, float] = {}
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        for doc_id in self.follow:
            self.seen.setdefault(doc_id, time.monotonic())

    def wait_for(self, doc_id: str, timeout: float = 30.0, poll: float = 0.0005) -> float:
        deadline = time.monotonic() + timeout
        while doc_id not in self.seen:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the feed never brought {doc_id}")
            time.sleep(poll)
        return self.seen[doc_id]


def measure_feed(name: str, db: Database, probe: FeedProbe, counted: list[int],
                 writes: int, burst: int) -> FeedRun:
    probe.thread.start()
    time.sleep(0.5)  # connected and idle
    idle = []
    for n in range(writes):
        db.save({"_id": f"{name}-idle-{n}", "type": "probe"})
        written = time.monotonic()
        idle.append(probe.wait_for(f"{name}-idle-{n}") - written)
        time.sleep(0.02)
    # The follower's own threads parse in this process: its CPU clock covers them.
    cpu_before, started = time.process_time(), time.monotonic()
    db.bulk_docs([{"_id": f"{name}-burst-{n:05d}", "type": "probe"} for n in range(burst)])
    last = probe.wait_for(f"{name}-burst-{burst - 1:05d}", poll=0.01)
    cpu = time.process_time() - cpu_before
    return FeedRun(name, {k: v * 1000 for k, v in summary(idle).items()}, last - started,
                   cpu * 1000 / burst, counted[0])


class CountingCouch(Couch):
    """A Couch that counts the requests its clients (streams included) send."""

    def __init__(self, url: str, **options: Any) -> None:
        self.requests = [0]
        super().__init__(url, **options)

    def _new_client(self, timeout: tuple[float, float]) -> Any:
        client = super()._new_client(timeout)
        client.get_http_client().hooks["response"].append(self._count)
        return client

    def _count(self, resp: requests.Response, **_: Any) -> None:
        self.requests[0] += 1


def run_feed(writes: int, burst: int) -> list[FeedRun]:
    from ibmcloudant.features.changes_follower import ChangesFollower

    with tempfile.TemporaryDirectory() as tmp, \
            LocalServer(free_port(), Path(tmp), in_memory=in_memory()) as server:
        db = Couch(server.url).ensure_database("feed_ours")
        ours, stop = CountingCouch(server.url), threading.Event()
        stream = (change.id for change in changes(
            ours.database(db.name), db.last_seq(), include_docs=True, conflicts=True,
            heartbeat_ms=5000, stop=stop))
        results = [measure_feed("stream", db, FeedProbe(stream), ours.requests, writes, burst)]
        stop.set()
        db = Couch(server.url).ensure_database("feed_sdk")
        sdk = CountingCouch(server.url, timeout=90.0)  # the follower wants >= 60 s
        follower = ChangesFollower(service=sdk.client, db=db.name, include_docs=True,
                                   conflicts=True)
        followed = (item.id for item in follower.start())
        results.append(measure_feed("ChangesFollower", db, FeedProbe(followed), sdk.requests,
                                    writes, burst))
        threading.Thread(target=follower.stop, daemon=True).start()  # it joins a long poll
    return results


@bench.command("feed")
@click.option("--writes", default=100, show_default=True, help="Single writes, one at a time.")
@click.option("--burst", default=2000, show_default=True, help="Documents in one bulk write.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable results.")
def feed_command(writes: int, burst: int, as_json: bool) -> None:
    """Our changes stream against the Cloudant SDK's ChangesFollower, on one server."""
    runs = run_feed(writes, burst)
    if as_json:
        print_json([run.as_json() for run in runs])
        return
    table = Table(title=f"following _changes with documents: {writes} single writes, "
                        f"then {burst} in one bulk write")
    for column in ("follower", "idle p50/p95/p99", "burst seen", "CPU/change", "requests"):
        table.add_column(column, justify="left" if column == "follower" else "right")
    for run in runs:
        table.add_row(run.name, "/".join(f"{run.idle_ms[p]:.1f}" for p in ("p50", "p95", "p99"))
                      + " ms", f"{run.burst_s:.2f} s", f"{run.cpu_ms_per_change:.3f} ms",
                      str(run.requests))
    Console().print(table)


@bench.command("soak")
@click.option("--minutes", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
              help="Start storm trials until this much time has passed.")
@click.option("--seed", type=int, default=None,
              help=f"The first trial's seed, to replay one (default: ${SEED_VARIABLE}, else "
                   "random).")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Storms a trial; each trial runs on fresh sites.")
@click.option("--round-seconds", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="How long each storm injects faults.")
@json_option
def soak_command(minutes: float, seed: int | None, rounds: int, round_seconds: float,
                 as_json: bool) -> None:
    """The fault suite's storms on local sites for as long as asked: random, overlapping
    faults while jobs arrive; every duplicate run named with its fault; the suite's table."""
    seed = fault_seed() if seed is None else seed
    click.echo(f"soak for {minutes:g} min, seed {seed} (replay: --seed {seed})", err=True)
    summaries: list[dict[str, Any]] = []

    def ended(summary: dict[str, Any]) -> None:
        summaries.append(summary)
        click.echo(f"{summary['scenario']} (seed {summary['seed']}): "
                   f"{sum(summary['faults'].values())} faults, {summary['jobs']} jobs, "
                   f"{len(summary['problems'])} problems", err=True)

    try:
        soak(minutes, seed, round_seconds, rounds, on_trial=ended)
    except KeyboardInterrupt:
        click.echo("interrupted: the table of the trials that ended", err=True)
    if as_json:
        print_json(summaries)
    else:
        click.echo("\n".join(fault_table(summaries)))
    if any(summary["problems"] for summary in summaries):
        raise SystemExit(1)


# --- bench targets: the speed issue's targets, each measured, in one run ----------------


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
    throughput, requests and CPU a step under a burst, worker use, and memory."""
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
    if as_json:
        print_json({"servers": servers_kind(), "targets": [asdict(t) for t in targets]})
        return
    Console().print(targets_table(targets))
    click.echo(f"{tally(targets)}; servers: {servers_kind()}")
