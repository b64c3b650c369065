"""The nearest-name rule behind every "did you mean" hint (jobdist/names.py).

Its JavaScript twin in validate_doc_update.js is compared with it through the
corpus of tests/test_validation.py.
"""

from __future__ import annotations

import pytest

from jobdist.names import did_you_mean, edit_distance, nearest_name, utf16_units

KNOWN = ["step", "job", "job_status", "priority", "meta"]


@pytest.mark.parametrize(("typed", "nearest"), [
    ("priorty", "priority"),   # a letter left out
    ("priiority", "priority"),  # one too many
    ("stpe", "step"),          # two letters swapped: one edit
    ("Step", "step"),          # case counts as an edit
    ("job status", "job_status"),
    ("jb", "job"),
    ("spot", None),            # three edits away
    ("x", None),               # as many edits as letters: no guess
    ("", None),
])
def test_the_nearest_name(typed: str, nearest: str | None) -> None:
    assert nearest_name(typed, KNOWN) == nearest


def test_the_closest_wins_then_the_earliest() -> None:
    assert nearest_name("jobs", ["step", "jobs_", "job"]) == "jobs_"  # both 1: earlier one
    assert nearest_name("jobs", ["steps", "job"]) == "job"
    assert nearest_name("mate", ["meta", "mute"]) == "mute"  # 1 edit beats 2


def test_lengths_are_utf16_code_units_as_in_javascript() -> None:
    assert len(utf16_units("😀b")) == 3
    assert nearest_name("😀b", ["job"]) == "job"  # 2 edits, fewer than its 3 units
    assert edit_distance(utf16_units("ab"), utf16_units("ba")) == 1
    assert edit_distance(utf16_units("ca"), utf16_units("abc")) == 3  # no edit twice


def test_the_hint_text() -> None:
    assert did_you_mean("priorty", KNOWN) == " (did you mean 'priority'?)"
    assert did_you_mean("colour", KNOWN) == ""
