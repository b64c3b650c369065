"""`jobdist bench replication`: what replication costs a step, by topology and site count.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ...couch import Database
from ...model import Doc, new_job, new_step
from ..scenarios import (
    site_db,
    wait_until_done,
)
from .common import REPLICATOR_AGENT, TOPOLOGIES, bench, local_cluster, print_json
from .revisions import WriteCounter
from .throughput import server_logs


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


def submit_jobs(db: Database, jobs: list[list[Doc]]) -> list[str]:
    docs = [new_job("global", steps) for steps in jobs]
    db.bulk_docs(docs)
    return [doc["_id"] for doc in docs]


def run_replication(topology: str, count: int, jobs: int, step_seconds: float,
                    workers: int) -> ReplicationRow:
    with local_cluster(count, workers, topology) as cluster:
        dbs = {name: site_db(cluster, name) for name in cluster.sites}
        logs = server_logs(cluster)
        counter = WriteCounter(dbs)
        started = time.monotonic()
        ids = submit_jobs(dbs["global"], replication_jobs(list(cluster.sites), jobs,
                                                          step_seconds))
        wait_until_done(dbs["global"], ids, timeout=300)
        makespan = time.monotonic() - started
        writes = counter.writes(ids)
        replicator = [r for log in logs for r in log.requests_since_start()
                      if r.agent.startswith(REPLICATOR_AGENT)]
    # Status documents replicate too; each of their revisions reaches a site at most
    # once, so at most `count - 1` of the replicated ones are theirs, per revision.
    status_replicated = min(writes.status_revisions * (count - 1), writes.replicated)
    return ReplicationRow(
        topology=topology, sites=count, jobs=jobs, steps=3,
        revisions_per_job=writes.job_revisions / jobs,
        status_writes_per_job=writes.status_revisions / jobs,
        replicated_per_job=(writes.replicated - status_replicated) / jobs,
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
@click.option("--jobs", default=12, show_default=True, type=click.IntRange(min=1),
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
