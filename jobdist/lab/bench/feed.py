"""`jobdist bench feed` (what the change feed costs) and `jobdist bench soak` (fault
storms for as long as asked).
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import requests
from rich.console import Console
from rich.table import Table

from ...couch import Couch, Database
from ...couch_changes import changes
from ..faults import SEED_VARIABLE, fault_seed, fault_table, soak
from ..localserver import LocalServer, free_port
from .common import bench, in_memory, json_option, print_json
from .throughput import summary


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
