"""Fault storms: hundreds of random, overlapping faults of every kind (daemons SIGKILLed
or paused within and past the lease, CouchDB servers SIGKILLed, links slowed, pairs
cut, sites isolated within and past the lease) while bursts of jobs arrive at random
creators; the strict audit names the fault behind every duplicate run.

Seeded from $JOBDIST_FAULT_SEED when set (to replay a failure), else at random; the
seed is in the table and in every failure's message. `jobdist bench soak` runs the
same storms for as long as asked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobdist.lab.faults import fault_seed, storm_trial

pytestmark = pytest.mark.faults

ROUNDS = 3
ROUND_SECONDS = 50.0


@pytest.mark.parametrize("storm", [1, 2])
def test_a_storm_of_overlapping_faults_loses_nothing_and_explains_every_duplicate(
        storm: int, tmp_path: Path, fault_summary: list[dict[str, Any]]) -> None:
    seed = fault_seed() + storm
    run = storm_trial(f"fault storm {storm}", seed, tmp_path, fault_summary, ROUNDS,
                      ROUND_SECONDS)
    assert run.audit is not None
    replay = f"replay with JOBDIST_FAULT_SEED={seed - storm}"
    assert run.audit.problems == [], replay
    assert sum(run.faults.values()) >= 100, f"too few faults injected; {replay}"
