"""`jobdist bench priorities`: how long low-priority jobs wait under a stream of urgent ones.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ... import core
from ...clock import seconds_between, utc_now
from ...model import Doc, new_job, new_step
from ..scenarios import (
    site_db,
    wait_until_done,
)
from .common import (
    bench,
    json_option,
    local_cluster,
    print_json,
    sites_option,
    timeout_option,
    workers_option,
)
from .throughput import (
    measures_table,
    summary,
)


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
        sites = len(cluster.sites)  # a deployment's (`--deployment`) may differ
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
