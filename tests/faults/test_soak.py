"""`jobdist bench soak`: the fault suite's storms for a chosen time, its table printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.faults


def test_soak_runs_storm_trials_for_the_time_given_and_prints_the_table(
        tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "jobdist", "bench", "soak", "--minutes", "0.1", "--rounds", "1",
         "--round-seconds", "8", "--seed", "42"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "seed 42 (replay: --seed 42)" in result.stderr
    assert "soak storm 1 (seed 42):" in result.stderr
    header, row, total, kinds, *_ = result.stdout.splitlines()
    assert header.split()[:3] == ["scenario", "seed", "faults"]
    assert row.startswith("soak storm 1") and row.split()[3] == "42"
    assert int(total.split()[3]) > 0  # faults injected
    assert kinds.startswith("faults by kind: ")
    assert not list(tmp_path.glob("jobdist-soak-*")), "the trial's directory was left behind"
