"""Crashes: daemons and CouchDB servers killed with SIGKILL mid-run, then restarted."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from jobdist.lab.faults import trial

pytestmark = pytest.mark.faults


def test_daemons_killed_at_random_moments_and_restarted(
        tmp_path: Path, fault_summary: list[dict[str, Any]]) -> None:
    with trial("daemon SIGKILL", 101, tmp_path, fault_summary) as run:
        run.submit([run.steps(3, (0.6, 1.8)) for _ in range(45)])
        while run.rounds < 15 and run.live():
            time.sleep(run.rng.uniform(0.2, 1.2))
            site = run.rng.choice(sorted(run.cluster.sites))
            os.kill(run.cluster.daemon_proc(site).pid, signal.SIGKILL)
            # Mostly back at once; sometimes down past lease and margin, so the
            # creator (unless it is the one down) revokes what the site ran.
            long = run.rng.random() < 0.2
            with run.injecting("daemon SIGKILL, down past the lease" if long
                               else "daemon SIGKILL", site):
                time.sleep(8.0 if long else run.rng.uniform(0.0, 1.0))
                run.cluster.start_daemon(site)
            run.rounds += 1
        run.notes["runs_when_faults_stopped"] = run.runs()
        audit = run.finish(timeout=120)
    assert audit.problems == []
    assert run.rounds >= 12, "the jobs ended before enough faults were injected"


def test_couchdb_servers_killed_mid_run_and_restarted_by_their_supervisors(
        tmp_path: Path, fault_summary: list[dict[str, Any]]) -> None:
    # On disk: a restarted in-memory server would come back empty (no database,
    # no users), which is a site lost for good, not a crash.
    with trial("CouchDB SIGKILL", 202, tmp_path, fault_summary, in_memory=False) as run:
        run.submit([run.steps(3, (0.3, 1.0)) for _ in range(30)])
        downtime = []
        while run.rounds < 6 and run.live():
            time.sleep(run.rng.uniform(0.5, 3.0))
            site = run.rng.choice(sorted(run.cluster.sites))
            pid = run.cluster.server_pid(site)
            os.kill(pid, signal.SIGKILL)
            with run.injecting("CouchDB SIGKILL", site):
                downtime.append(round(run.restarted_server(site, pid), 1))
            run.rounds += 1
        run.notes["server_downtime_seconds"] = downtime
        audit = run.finish(timeout=120)
    assert audit.problems == []  # daemons alive, no error logged, included
    assert run.rounds >= 4, "the jobs ended before enough faults were injected"
