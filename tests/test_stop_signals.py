"""A command that brings local sites up for its own run stops them all when stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobdist.lab.cluster import Proc, stop_all

from .helpers import wait_for

pytestmark = pytest.mark.e2e


def recorded(root: Path) -> list[Proc]:
    """Every process the bench's cluster recorded, once all its daemons are up."""
    procs = []
    for state in root.glob("jobdist-bench-*/state/cluster.json"):
        try:
            sites = json.loads(state.read_text())["sites"]
        except (OSError, ValueError, KeyError):
            return []
        procs += [Proc(**roles[role]) for roles in sites.values() for role in roles]
    return procs


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_bench_stops_every_server_and_daemon_it_started(
        tmp_path: Path, signum: signal.Signals) -> None:
    bench = subprocess.Popen(
        # In-memory servers, as before benchmarks ran on disk: this is about signals, and
        # on-disk servers under a 3,000-job burst once took 33 s to stop (issue left open).
        [sys.executable, "-m", "jobdist", "bench", "--in-memory", "throughput", "--jobs",
         "3000", "--raw-writes", "10"],
        env={**os.environ, "TMPDIR": str(tmp_path)}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs: list[Proc] = []
    try:
        procs = wait_for(lambda: len(recorded(tmp_path)) == 6 and recorded(tmp_path),
                         timeout=90, what="3 servers and 3 daemons to be up")
        time.sleep(1.0)  # jobs are being submitted and run
        os.kill(bench.pid, signum)  # the pid alone, as `kill PID` or a CI timeout does
        started = time.monotonic()
        bench.wait(timeout=60)
        assert time.monotonic() - started < 30
        assert not [proc.pid for proc in procs if proc.alive()]
    finally:
        stop_all(procs, timeout=5)
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
