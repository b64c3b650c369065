"""The one clock: protocol times as ISO 8601 UTC strings with microseconds.

Every time a job document holds (created, updated, leases, starts, finishes,
history) is read from `utc_now` and written by `format_time`, so the strings
sort as the moments do. The fault suite skews a site's clock by setting
$JOBDIST_CLOCK_OFFSET (seconds): everything the site writes moves with it.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

CLOCK_OFFSET = float(os.environ.get("JOBDIST_CLOCK_OFFSET", "0") or 0)

def utc_now() -> str:
    """The time as ISO 8601 UTC with microseconds: sortable as a string.

    The daemon's one wall clock for the protocol (leases, keep-alive). The fault
    suite skews a site's clock by setting $JOBDIST_CLOCK_OFFSET (seconds).
    """
    return format_time(datetime.now(UTC) + timedelta(seconds=CLOCK_OFFSET))


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    """Any time the rules accept: the fraction may be missing or have up to 9 digits."""
    whole, _, fraction = text.removesuffix("Z").partition(".")
    moment = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return moment.replace(microsecond=int(fraction[:6].ljust(6, "0")))


def later(moment: str, seconds: float) -> str:
    return format_time(parse_time(moment) + timedelta(seconds=seconds))


def seconds_between(earlier: str, later_moment: str) -> float:
    return (parse_time(later_moment) - parse_time(earlier)).total_seconds()
