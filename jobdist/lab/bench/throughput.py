"""`jobdist bench throughput`: steps per second, latency and revisions a step under a burst.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ...clock import seconds_between, utc_now
from ...config import CouchSettings
from ...couch import Couch
from ...couch_sync import sync_design_docs
from ...design import load_design_docs
from ...model import Doc, new_job, new_step
from ...setup import admin_couch_of
from ..cluster import LocalCluster
from ..deployment import DeploymentError
from ..scenarios import (
    site_db,
    submit_all,
    wait_until_done,
)
from .common import (
    ServerLog,
    bench,
    cluster_pids,
    cpu_seconds,
    deployment,
    json_option,
    local_cluster,
    percentile,
    print_json,
    request_census,
    servers_kind,
    sites_option,
    timeout_option,
    topology_option,
    workers_option,
)
from .revisions import WriteCounter, count_revisions


@dataclass(frozen=True)
class RawRates:
    """What the server itself sustains: docs per second, one PUT each and in one _bulk_docs."""

    docs: int
    single_put_per_s: float
    bulk_docs_per_s: float


RAW_DATABASE = "jobdist_bench_raw"  # a fixed name: a deployment's bench leaves nothing else


def raw_write_rates(couch: Couch, docs: int) -> RawRates:
    """Write job-shaped documents into a database of their own with our design documents."""
    db = couch.ensure_database(RAW_DATABASE)
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
    remote_latency: dict[str, float]  # the same, of the steps run away from their creator
    overhead: dict[str, float]  # scheduling overhead, seconds (see scheduling_overheads)
    busy: dict[str, float]  # each site's share of worker time busy while work waited
    revisions_per_step: float  # writes per step after the submission, conflicts included
    conflict_leaves: int
    raw: RawRates
    cpu: dict[str, float]  # CPU seconds during the run, by role
    jobs_ok: int
    requests: dict[str, int]  # by sender and kind, when asked for (see ServerLog)
    creator: str  # the first site, which submits the jobs (or its share) and sees them done
    submit_at: str  # "first": all jobs created at the creator; "every": a share at each site
    topology: str
    replicated: int  # copies replication wrote into the sites, once it settled (revisions.py)
    status_revisions: int  # the sites' own status documents written meanwhile
    remote_share: float  # steps run away from their creator: each costs a revision more

    @property
    def revisions_floor(self) -> float:
        """Revisions a step with no conflict: 1 for a step the creator runs (start and
        end in one), 2 for one it assigns (the win, then start and end)."""
        return 1 + self.remote_share

    @property
    def replicated_per_step(self) -> float:
        return self.replicated / self.jobs

    @property
    def replication_requests_per_step(self) -> float | None:
        """The replicators' requests a step; None unless the census was taken."""
        if not self.requests:
            return None
        sent = sum(count for kind, count in self.requests.items()
                   if kind.startswith("replicator "))
        return sent / self.jobs

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
                               "replicated_per_step": self.replicated_per_step,
                               "revisions_floor": self.revisions_floor,
                               "replication_requests_per_step":
                                   self.replication_requests_per_step,
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
                   timeout: float, census: bool = False, command: str = "true",
                   topology: str = "mesh", submit_at: str = "first") -> Throughput:
    """`submit_at` "first": the whole burst is created at the first site; "every": each
    site creates an equal share, as regions that submit their own work do."""
    with local_cluster(sites, workers, topology) as cluster:
        first, sites = next(iter(cluster.sites)), len(cluster.sites)
        dbs = {name: site_db(cluster, name) for name in cluster.sites}
        db = dbs[first]
        raw = raw_write_rates(admin_couch_of(cluster.sites[first]), raw_docs)
        creators = list(cluster.sites) if submit_at == "every" else [first]
        logs = server_logs(cluster) if census else []
        counter = WriteCounter(dbs)
        pids = cluster_pids(cluster)
        cpu_before = {role: sum(map(cpu_seconds, p)) for role, p in pids.items()}
        ready = utc_now()
        started = time.monotonic()
        ids = [job_id for index, creator in enumerate(creators)
               for job_id in submit_all(dbs[creator], creator, [new_step(command)],
                                        share(jobs, len(creators), index))]
        docs = wait_until_done(db, ids, timeout)
        wall = time.monotonic() - started
        cpu = {role: sum(map(cpu_seconds, p)) - cpu_before[role] for role, p in pids.items()}
        writes = counter.writes(ids)  # replication settled: the census sees all it sent
        requests = request_census(logs)
        revisions = count_revisions(db, ids)
    return Throughput(
        jobs=jobs, command=command, sites=sites, workers=workers, wall=wall,
        execution_window=seconds_between(
            min(d["created_at"] for d in docs),
            max(d["job"][0]["finish_time"] for d in docs)),
        latency=summary([submit_to_start(d) for d in docs]),
        remote_latency=summary([submit_to_start(d) for d in docs if ran_away(d)]),
        overhead=summary(scheduling_overheads(docs, ready)),
        busy=busy_shares(docs, workers),
        revisions_per_step=(revisions.total - jobs) / jobs,
        conflict_leaves=revisions.conflict_leaves,
        raw=raw, cpu=cpu | {"wall": wall},
        jobs_ok=sum(d["job_status"] == "success" for d in docs),
        requests=requests, creator=first, submit_at=submit_at, topology=topology,
        replicated=writes.replicated, status_revisions=writes.status_revisions,
        remote_share=sum(map(ran_away, docs)) / jobs,
    )


def share(jobs: int, parts: int, index: int) -> int:
    """The jobs part `index` of `parts` submits: equal shares, the first ones a job more."""
    return jobs // parts + (index < jobs % parts)


def ran_away(doc: Doc) -> bool:
    """Did the job's step run at a site other than its creator (a revision more)?"""
    return bool(doc["job"][0]["winner"] != doc["creator"])


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


def cpu_text(cpu: dict[str, float], role: str, scale: float = 1.0) -> str:
    """A role's CPU, or "-" when its processes were not ours to watch (a deployment)."""
    return f"{cpu[role] * scale:.1f}" if role in cpu else "-"


def throughput_table(r: Throughput) -> Table:
    title = (f"{r.jobs} single-step `{r.command}` jobs, {r.sites} sites x {r.workers} "
             f"workers ({r.topology}), submitted at once at "
             f"{'every site' if r.submit_at == 'every' else r.creator}")
    replication_requests = r.replication_requests_per_step
    ms = 1000.0
    rows = [
        (f"steps/s (until all seen done at {r.creator})", f"{r.steps_per_s:.1f}"),
        ("steps/s (first creation to last step end)",
         f"{r.jobs / r.execution_window:.1f}"),
        ("submit-to-start p50/p95/p99", percentiles_ms(r.latency)),
        ("  of steps run away from their creator",
         percentiles_ms(r.remote_latency) if r.remote_latency else "none"),
        ("scheduling overhead p50/p95/p99", percentiles_ms(r.overhead)),
        ("writes per step (after submission)", f"{r.revisions_per_step:.2f}"),
        ("  with no conflict (1 + share run away from their creator)",
         f"{r.revisions_floor:.2f} ({r.remote_share:.0%} away)"),
        ("conflict leaves (all jobs)", str(r.conflict_leaves)),
        ("documents replicated per step (jobs' and statuses')",
         f"{r.replicated_per_step:.2f}"),
        ("status documents written per step", f"{r.status_revisions / r.jobs:.2f}"),
        ("replication requests per step", "(with --requests)" if replication_requests is None
         else f"{replication_requests:.2f}"),
        ("writes/s caused by the jobs", f"{r.writes_per_s:.1f}"),
        (f"raw single PUTs/s ({r.raw.docs} docs, same server)",
         f"{r.raw.single_put_per_s:.1f}"),
        (f"raw _bulk_docs docs/s ({r.raw.docs} docs)", f"{r.raw.bulk_docs_per_s:.1f}"),
        ("job writes/s / raw single PUTs/s",
         f"{r.writes_per_s / r.raw.single_put_per_s:.2f}"),
        ("CPU s: servers / daemons / wall",
         f"{cpu_text(r.cpu, 'server')} / {r.cpu['daemon']:.1f} / {r.cpu['wall']:.1f}"),
        ("CPU ms a step: servers / daemons",
         f"{cpu_text(r.cpu, 'server', ms / r.jobs)} / {r.cpu['daemon'] / r.jobs * ms:.1f}"),
        ("workers busy while work waited", ", ".join(
            f"{site} {share:.0%}" for site, share in r.busy.items())),
        ("jobs ok", f"{r.jobs_ok}/{r.jobs}"),
    ]
    return measures_table(title, rows)


@bench.command("throughput")
@click.option("--jobs", default=500, show_default=True, type=click.IntRange(min=1),
              help="Single-step jobs to submit.")
@sites_option
@topology_option
@workers_option(4)
@click.option("--raw-writes", default=500, show_default=True, type=click.IntRange(min=1),
              help="Documents for the server's raw write rate.")
@timeout_option(600.0)
@click.option("--requests", "census", is_flag=True,
              help="Also count the servers' requests by sender and kind (debug logs: slower).")
@click.option("--command", default="true", show_default=True, help="Each job's one step.")
@click.option("--submit-at", type=click.Choice(["first", "every"]), default="first",
              show_default=True, help="first: the whole burst created at global; every: "
              "each site creates an equal share (regions submitting their own work).")
@json_option
def throughput_command(jobs: int, sites: int, topology: str, workers: int, raw_writes: int,
                       timeout: float, census: bool, command: str, submit_at: str,
                       as_json: bool) -> None:
    """Steps per second, scheduling latency and writes per step, beside the raw write rate
    and what replication cost a step."""
    if census and deployment() is not None:
        raise DeploymentError("--requests cannot count a deployment's requests: it reads "
                              "the debug log pouchdb-server writes on this disk")
    result = run_throughput(jobs, sites, workers, raw_writes, timeout, census, command,
                            topology, submit_at)
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
