"""The fault suite's summary: every scenario records its figures here.

At the end of the session they are written, as one JSON list, to
$JOBDIST_FAULTS_SUMMARY or else `.jobdist/faults-summary.json` in the
repository, and printed in pytest's terminal summary as jobdist.lab.faults's table
(no `-s` needed; `jobdist bench soak` prints the same), so docs/reliability.md can
quote them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobdist.lab.faults import fault_table

REPO = Path(__file__).resolve().parents[2]
SUMMARIES = pytest.StashKey[list[dict[str, Any]]]()


def summary_path() -> Path:
    override = os.environ.get("JOBDIST_FAULTS_SUMMARY")
    return Path(override) if override else REPO / ".jobdist" / "faults-summary.json"


@pytest.fixture(scope="session")
def fault_summary(request: pytest.FixtureRequest) -> Iterator[list[dict[str, Any]]]:
    """The scenarios' summaries; written to `summary_path()` when the session ends."""
    summaries = request.config.stash.setdefault(SUMMARIES, [])
    yield summaries
    path = summary_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summaries, indent=2) + "\n")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    summaries = config.stash.get(SUMMARIES, [])
    if not summaries:
        return
    terminalreporter.section("fault scenarios")
    for line in fault_table(summaries):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"written to {summary_path()}")
