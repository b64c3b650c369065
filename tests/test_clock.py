"""The one clock: times written and read back as the protocol holds them."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone

import pytest

from jobdist.clock import format_time, parse_time


def test_a_written_time_reads_back_as_the_same_moment() -> None:
    rng = random.Random(16)
    for _ in range(2000):
        moment = datetime(1, 1, 1, tzinfo=UTC) + timedelta(
            microseconds=rng.randrange(315537897600000000))
        text = format_time(moment)
        assert len(text) == 27 and text.endswith("Z")  # years before 1000 too: 0999-...
        assert parse_time(text) == moment and parse_time(text).tzinfo is UTC


def test_a_time_in_another_zone_is_written_in_utc() -> None:
    moment = datetime(2026, 1, 1, 5, 0, tzinfo=timezone(timedelta(hours=2)))
    assert format_time(moment) == "2026-01-01T03:00:00.000000Z"


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-01-01T00:00:00Z", datetime(2026, 1, 1, tzinfo=UTC)),
    ("2026-01-01T00:00:00.5Z", datetime(2026, 1, 1, 0, 0, 0, 500000, tzinfo=UTC)),
    ("2026-01-01T00:00:00.123456789Z", datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)),
    # Not the rules' form, but 27 characters like ours: read as before, in UTC.
    ("2026-01-01T00:00:00.0000000", datetime(2026, 1, 1, tzinfo=UTC)),
])
def test_every_form_the_rules_accept_is_read_in_utc(text: str, expected: datetime) -> None:
    assert parse_time(text) == expected and parse_time(text).tzinfo is UTC


def test_a_time_with_an_offset_is_refused_as_before() -> None:
    """A leaf nobody validated may hold anything (waiting.py reads `not_before` so)."""
    with pytest.raises(ValueError):
        parse_time("2026-01-01T00:00:00.0+05:00")
