"""Load and clocks: a thousand jobs at once, and sites whose clocks disagree."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from jobdist.lab.audit import read_ledger
from jobdist.lab.faults import LEASE, Trial, trial

from ..helpers import wait_for

pytestmark = pytest.mark.faults

MARGIN = LEASE / 6  # what write_sites sets


def test_a_thousand_jobs_created_at_once_with_bulk_docs(
        tmp_path: Path, fault_summary: list[dict[str, Any]]) -> None:
    # Replication direct, not regions apart: this scenario measures the sites under
    # load, and 1,000 jobs' revisions through 1 MB/s links take longer than CI has.
    with trial("1000 jobs at once", 505, tmp_path, fault_summary, workers=3,
               proxied=False) as run:
        started = time.monotonic()
        run.submit([run.steps(1, (0.0, 0.0)) for _ in range(1000)])  # one _bulk_docs request
        audit = run.finish(timeout=600)
        run.notes["jobs_per_second"] = round(len(run.ids) / (time.monotonic() - started), 1)
    assert audit.problems == []
    assert audit.duplicates == [] and audit.runs == 1000  # no step twice, with no fault


def test_clocks_skewed_within_the_margin_revoke_nothing(
        tmp_path: Path, fault_summary: list[dict[str, Any]]) -> None:
    # Pairwise skew at most 0.9 s < margin; some steps outlive the lease, so they
    # hold it only through heartbeats written and judged on different clocks.
    offsets = {"global": 0.45, "reg_a": -0.45, "reg_b": 0.0}
    with trial("clock skew within margin", 606, tmp_path, fault_summary) as run:
        run.restart_daemons(offsets)
        run.fault("clock skew within margin", tuple(offsets), str(offsets))
        long = LEASE + 2.0
        run.submit([run.steps(3, (0.3, 1.0)) for _ in range(24)] +
                   [run.steps(1, (long, long)) + run.steps(1) for _ in range(4)])
        audit = run.finish(timeout=120)
        run.rounds = 1
        run.notes["revocations"] = len(run.events("released", "lease of"))
    assert audit.problems == []
    assert run.notes["revocations"] == 0 and audit.duplicates == []


def running_on(run: Trial, site: str) -> bool:
    """Does the ledger show a step started on `site` that has not ended?"""
    rows = read_ledger(run.ledger)
    runs = Counter(row[1:] for row in rows if row[0] == "start" and row[3] == site)
    runs.subtract(row[1:] for row in rows if row[0] == "end" and row[3] == site)
    return any(count > 0 for count in runs.values())


def test_clocks_skewed_beyond_the_margin_revoke_only_a_dead_winner(
        tmp_path: Path, fault_summary: list[dict[str, Any]]) -> None:
    # The creator 30 s ahead, reg_b 20 s behind: every deadline reg_b writes
    # looks long past to the creator. Only silence counts: leases renewed in time
    # stay, however skewed, and a winner that dies still loses its steps.
    offsets = {"global": 30.0, "reg_b": -20.0}
    with trial("clock skew beyond margin", 707, tmp_path, fault_summary) as run:
        run.restart_daemons(offsets)
        run.fault("clock skew beyond margin", tuple(offsets), str(offsets))
        long = LEASE + 2.0
        run.submit([run.steps(2, (0.3, 1.0)) for _ in range(20)] +
                   [run.steps(1, (long, long), targets=("reg_b",)) + run.steps(1)
                    for _ in range(3)])
        wait_for(lambda: running_on(run, "reg_a"), 60, "reg_a to run a step")
        os.kill(run.cluster.daemon_proc("reg_a").pid, signal.SIGKILL)
        with run.injecting("daemon SIGKILL, down past the lease", "reg_a", "down 10 s"):
            time.sleep(10.0)
            run.cluster.start_daemon("reg_a")
        run.rounds = 1
        audit = run.finish(timeout=180)
        revoked = [entry["detail"] for entry in run.events("released", "lease of")]
        run.notes.update(revocations=len(revoked),
                         revoked_live=sum("lease of reg_a" not in d for d in revoked))
    assert audit.problems == []
    assert revoked and run.notes["revoked_live"] == 0, revoked
