"""Schedules: a document that makes its owner site create a job at every tick.

The document, its fields and its `missed` policies are described in
docs/job-document.md ("Schedules"). Only the owner's daemon creates a schedule's
jobs (`Scheduler`, a thread of the daemon), and a tick's job is the same document
wherever and however often it is made (id `job-<tick>-<name>`, fields from the
schedule and the tick alone): two sites that make one tick write one job, at worst
two identical revisions, merged like any other conflict (docs/protocol.md,
"Schedules: one job per tick"). Ticks are computed in the schedule's time zone,
daylight saving followed (cronsim).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .clock import format_time, later, parse_time, seconds_between, utc_now
from .couch import Conflict, Database, Saved, Undecodable
from .design import DDOC
from .document_rules import SCHEDULE_DEFAULTS, validate_schedule
from .model import Doc, new_job
from .periodic import Periodic

LATE_AFTER = 60.0  # seconds: a tick found later than this was missed
MAX_CATCH_UP = 100  # missed ticks run in one pass under the "all" policy
END_OF_TIME = "9999-12-31T23:59:59Z"
MAX_TICKS = 10_000  # ticks looked at in one pass: a schedule every minute for a week
PASS_SECONDS = 10.0  # the owner looks at its schedules at least this often
STATE = "jobdist-scheduler"  # _local/<STATE>-<site>: when each schedule was last looked at


class BadSchedule(ValueError):
    """A schedule that cannot make jobs: the message says which rule it breaks."""


def schedule_id(name: str) -> str:
    return f"schedule-{name}"


def new_schedule(name: str, cron: str, owner: str, submission: Doc, *, timezone: str = "UTC",
                 missed: str = "latest", enabled: bool = True, now: str | None = None) -> Doc:
    """A schedule document; BadSchedule when it breaks a rule (all of them, in one message)."""
    now = now or utc_now()
    doc = {"_id": schedule_id(name), "type": "schedule", "name": name, "cron": cron,
           "timezone": timezone, "owner": owner, "enabled": enabled, "missed": missed,
           "job": submission, "created_at": now, "updated_at": now}
    check_schedule(doc)
    return doc


def check_schedule(doc: Any) -> None:
    """validate_doc_update's rules, then what only Python can check: the cron
    expression's values and the time zone's name."""
    problems = validate_schedule(doc)
    if not problems:
        try:
            zone(doc)
        except (ZoneInfoNotFoundError, ValueError):
            problems.append(f"timezone: unknown time zone {doc['timezone']!r}")
        try:
            CronSim(doc["cron"], datetime.now())
        except CronSimError as error:
            problems.append(f"cron: {doc['cron']!r}: {str(error).lower()}")
    if problems:
        raise BadSchedule("; ".join(problems))


def zone(doc: Doc) -> ZoneInfo:
    return ZoneInfo(doc.get("timezone") or SCHEDULE_DEFAULTS["timezone"])


def ticks(doc: Doc, after: str, until: str) -> Iterator[str]:
    """The schedule's ticks in (after, until], as UTC times, oldest first."""
    local = parse_time(after).astimezone(zone(doc))
    for count, moment in enumerate(CronSim(doc["cron"], local)):
        tick = format_time(moment)
        if tick > until or count >= MAX_TICKS:
            return
        yield tick


def next_ticks(doc: Doc, after: str, count: int) -> list[str]:
    """The schedule's next `count` ticks after `after`."""
    return list(itertools.islice(ticks(doc, after, until=END_OF_TIME), count))


def due_ticks(doc: Doc, after: str, now: str) -> tuple[list[str], int]:
    """The ticks to create jobs for now, and how many missed ticks the policy skips."""
    all_ticks = list(ticks(doc, after, now))
    late_before = later(now, -LATE_AFTER)
    on_time = [tick for tick in all_ticks if tick >= late_before]
    missed = all_ticks[:len(all_ticks) - len(on_time)]
    policy = doc.get("missed") or SCHEDULE_DEFAULTS["missed"]
    caught_up = {"latest": missed[-1:], "all": missed[-MAX_CATCH_UP:], "skip": []}[policy]
    return caught_up + on_time, len(missed) - len(caught_up)


def tick_job_id(name: str, tick: str) -> str:
    compact = tick.replace("-", "").replace(":", "")
    return f"job-{compact}-{name}"


def tick_job(doc: Doc, tick: str) -> Doc:
    """The job of one tick: the same document whoever makes it."""
    template = doc["job"]
    job = new_job(doc["owner"], template["job"], priority=template.get("priority", 0),
                  created_at=tick, job_id=tick_job_id(doc["name"], tick),
                  meta=template.get("meta"))
    job["schedule"] = {"name": doc["name"], "tick": tick}
    return job


@dataclass
class TickReport:
    created: list[str]  # job ids written now
    existing: list[str]  # job ids some site had written already
    skipped: int  # missed ticks the policy did not run


class Scheduler(Periodic):
    """The owner's half of schedules: every pass, create the jobs of the ticks due."""

    what = "schedule pass"

    def __init__(self, db: Database, site: str, stop: threading.Event,
                 period: float = PASS_SECONDS) -> None:
        super().__init__("scheduler", site, stop, "jobdist.schedules")
        self.db = db
        self.period = period
        self.delay = 1.0  # until the first pass: the schedules are read once the site runs

    def wait_before_pass(self) -> float:
        return self.delay

    def pass_once(self) -> dict[str, TickReport]:
        state = self.db.get_local(f"{STATE}-{self.site}") or {}
        checked: dict[str, str] = dict(state.get("checked") or {})
        reports = {}
        upcoming: list[str] = []
        for doc in self.owned_schedules():
            now = utc_now()
            try:
                check_schedule(doc)
            except BadSchedule as problem:  # (written where validation was off)
                self.log.error("schedule skipped", schedule=doc.get("_id"), error=problem)
                continue
            name = doc["name"]
            if not doc.get("enabled", True):
                continue
            after = max(checked.get(name, ""), doc["updated_at"])
            reports[name] = self.create_due(doc, after, now)
            checked[name] = now
            upcoming += next_ticks(doc, now, 1)
        self.db.put_local(f"{STATE}-{self.site}", {"checked": checked})
        # Wake at the next tick (a job on time to the second), or in `period` at most
        # to see schedules added or changed meanwhile.
        self.delay = self.period
        if upcoming:
            self.delay = min(self.period, max(0.05, seconds_between(utc_now(), min(upcoming))))
        return reports

    def owned_schedules(self) -> list[Doc]:
        mine = {"startkey": [self.site], "endkey": [self.site, {}]}
        try:
            rows = self.db.view(DDOC, "schedules", include_docs=True, **mine)
            return [row["doc"] for row in rows if row.get("doc")]
        except Undecodable:
            # One schedule nested too deeply for Python's parser (written where validation
            # was off) spoils the answer: read each alone, and skip that one.
            rows = self.db.view(DDOC, "schedules", **mine)
            return [doc for row in rows if (doc := self._read_alone(row["id"])) is not None]

    def _read_alone(self, doc_id: str) -> Doc | None:
        try:
            return self.db.get(doc_id)
        except Undecodable as error:
            self.log.error("schedule skipped", schedule=doc_id, error=error)
            return None

    def create_due(self, doc: Doc, after: str, now: str) -> TickReport:
        due, skipped = due_ticks(doc, after, now)
        report = TickReport([], [], skipped)
        if skipped:
            self.log.warning("missed ticks skipped", schedule=doc["name"], count=skipped,
                             policy=doc.get("missed"))
        jobs = [tick_job(doc, tick) for tick in due]
        for job, result in zip(jobs, self.db.bulk_docs(jobs), strict=True):
            if isinstance(result, Saved):
                report.created.append(job["_id"])
                self.log.info("tick job created", job=job["_id"], step=job["step"],
                              schedule=doc["name"], tick=job["created_at"])
            elif isinstance(result, Conflict):
                report.existing.append(job["_id"])
            else:
                self.log.error("tick job refused", job=job["_id"], step=job["step"],
                               schedule=doc["name"], result=result)
        return report
