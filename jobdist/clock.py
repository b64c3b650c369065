"""The one clock: protocol times as ISO 8601 UTC strings with microseconds.

Every time a job document holds (created, updated, leases, starts, finishes,
history) is read from `utc_now` and written by `format_time`, so the strings
sort as the moments do. The fault suite skews a site's clock by setting
$JOBDIST_CLOCK_OFFSET (seconds): everything the site writes moves with it.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime, timedelta

from .errors import JobdistError

CLOCK_OFFSET = float(os.environ.get("JOBDIST_CLOCK_OFFSET", "0") or 0)

def utc_now() -> str:
    """The time as ISO 8601 UTC with microseconds (skewed by CLOCK_OFFSET)."""
    return format_time(datetime.now(UTC) + timedelta(seconds=CLOCK_OFFSET))


def format_time(moment: datetime) -> str:
    # (isoformat is C throughout, a third faster than strftime, called every decision)
    return moment.astimezone(UTC).isoformat(timespec="microseconds")[:-6] + "Z"


# What format_time writes. (fromisoformat alone would also read an offset or a time
# without one, which the slower path below refuses or takes as UTC.)
FORMATTED = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")


def parse_time(text: str) -> datetime:
    """Any time the rules accept: the fraction may be missing or have up to 9 digits."""
    if FORMATTED.fullmatch(text):  # as format_time writes it: read by C alone
        return datetime.fromisoformat(text)
    whole, _, fraction = text.removesuffix("Z").partition(".")
    moment = datetime.fromisoformat(whole).replace(tzinfo=UTC)  # 3x faster than strptime
    return moment.replace(microsecond=int(fraction[:6].ljust(6, "0")))


def later(moment: str, seconds: float) -> str:
    return format_time(parse_time(moment) + timedelta(seconds=seconds))


def seconds_between(earlier: str, later_moment: str) -> float:
    return (parse_time(later_moment) - parse_time(earlier)).total_seconds()


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_DURATION = timedelta(days=36500)  # a hundred years


class DurationError(JobdistError, ValueError):
    """A duration (a retention period, say) that cannot be read."""


def parse_duration(text: str) -> timedelta:
    """`90m`, `12h`, `30d`, `2w`, `1d12h`, `45s` as a timedelta (m is minutes)."""
    compact = text.strip().lower()
    parts = _DURATION_PART.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact.replace(" ", ""):
        raise DurationError(
            f"{text!r} is not a duration: use a number and a unit s, m, h, d or w "
            "(e.g. 90m, 12h, 30d)")
    seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    if seconds <= 0:
        raise DurationError(f"{text!r}: a period must be longer than 0")
    if seconds > MAX_DURATION.total_seconds():  # a time that far off is no date
        raise DurationError(f"{text!r}: too long; a period is at most {MAX_DURATION.days}d")
    return timedelta(seconds=seconds)
