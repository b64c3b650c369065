"""The exhaustive search of the safety path (jobdist/lab/modelcheck.py) at a bound CI
affords: every interleaving of the small model up to that many events and faults.

Deeper, as a command: JOBDIST_MODELCHECK_FAULTS=K JOBDIST_MODELCHECK_DEPTH=D
JOBDIST_MODELCHECK_SECONDS=S python3 -m pytest tests/test_modelcheck.py -s -k bound
(the search stops at S seconds and says how deep it got; a violation fails the
test with the schedule that replays it); JOBDIST_MODELCHECK_FROM=cut-apart searches
from one of modelcheck.PREFIXES (its faults count in K, its events not in D).
"""

from __future__ import annotations

import os

import pytest

from jobdist.core import decide
from jobdist.core.edits import release
from jobdist.core.types import Context, Edit
from jobdist.lab import modelcheck
from jobdist.model import Job

# CI's bound: one fault, every interleaving of up to 8 events (54,215 states, 135 s at load 10).
FAULTS = int(os.environ.get("JOBDIST_MODELCHECK_FAULTS", "1"))
DEPTH = int(os.environ.get("JOBDIST_MODELCHECK_DEPTH", "8"))
SECONDS = float(os.environ.get("JOBDIST_MODELCHECK_SECONDS", "0")) or None
PREFIX = modelcheck.PREFIXES.get(os.environ.get("JOBDIST_MODELCHECK_FROM", ""), ())


def test_no_violation_within_the_bound() -> None:
    report = modelcheck.search(FAULTS, DEPTH, time_limit=SECONDS, prefix=PREFIX)
    print(report.summary())
    assert report.counterexample is None, \
        f"{report.summary()}\nreplay: {report.counterexample!r}"
    assert report.depth == DEPTH or report.exhausted or SECONDS


def test_a_counterexample_replays() -> None:
    """The search finds a planted fault in the core (a release that lowers the epoch
    and forgets the step's events above it, so that a win issues the released run's
    token again) and prints a schedule that replays it."""
    def release_lowering_the_epoch(ctx: Context, detail: str, *args: object) -> Edit:
        released = release(ctx, detail, *args)  # type: ignore[arg-type]

        def edit(doc: Job) -> None:
            released(doc)
            index = doc["step"]
            floor = doc["job"][index]["epoch"] = doc["job"][index]["epoch"] - 2
            doc["history"] = [entry for entry in doc["history"]
                              if entry["step"] != index or entry.get("epoch", 0) <= floor]
        return edit

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decide, "release", release_lowering_the_epoch)
        report = modelcheck.search(1, 6)
        assert report.counterexample is not None, report.summary()
        assert modelcheck.replay(report.counterexample) == report.problems
