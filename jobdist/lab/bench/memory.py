"""`jobdist bench memory`: a daemon's memory with many jobs in its database.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ... import core
from ...couch import Database
from ...model import Doc, new_job, new_step, normalise
from ...step_run import StepResult
from ..scenarios import (
    site_db,
)
from .common import bench, cpu_seconds, local_cluster, memory_kib, print_json


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
        core.start(ctx, f"{creator}/w0", direct=True)(job)
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
@click.option("--jobs", default=10_000, show_default=True, type=click.IntRange(min=1),
              help="Finished jobs to pre-fill.")
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
