"""The operator's API: read jobs as the daemons see them, list them, submit,
cancel and adopt.

The CLI, the dashboard, the lab's benchmarks and the tests call these; none
of them prints anything. What goes wrong for a reason the caller should show
a person is a `JobdistError` (`NoSuchJob`, `JobExists`, `InvalidJob`,
`StillConflicting`); CouchDB's own errors stay `CouchError`s.

A job here is always the merge of all its live leaf revisions (`core.merge`),
never CouchDB's winning revision alone: the same view the daemons decide on.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from jobdist import core
from jobdist.clock import utc_now
from jobdist.config import SiteConfig
from jobdist.couch import Conflict, Couch, CouchError, Database, Saved
from jobdist.couch_views import iter_view
from jobdist.design import DDOC, PEOPLE_DDOC
from jobdist.errors import JobdistError
from jobdist.model import (
    FINAL_STATUSES,
    JOB_FORMAT,
    Doc,
    Leaf,
    Phase,
    as_doc,
    awaited,
    fan_out,
    is_waiting,
    job_from_submission,
    newer_format,
    normalise,
    step_phase,
)
from jobdist.schedules import schedule_id
from jobdist.validation import validate_job, validate_submission

# A live job is "waiting" while it waits for other jobs or a time (model.is_waiting).
STATUSES = ("live", "waiting", *FINAL_STATUSES)
WRITE_ATTEMPTS = 5  # cancel and adopt read again after a conflict, this many times


class NoSuchJob(JobdistError):
    """The site has no job by that id."""


class NewerFormat(JobdistError):
    """A job written by a newer release of jobdist than this one."""


class JobExists(JobdistError):
    """A job with the id being submitted is there already."""


class InvalidJob(JobdistError):
    """A submission that breaks the job document's rules: one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class StillConflicting(JobdistError):
    """A write that lost to concurrent writers on every try."""


def site_database(site: SiteConfig, *, quick: bool = False) -> Database:
    """The site's jobs database for an operator's command: a few quick retries, not
    the daemon's patience (`quick`: fewer, for views that refresh every second)."""
    timeout, retries, retry_time = (3.0, 1, 1.0) if quick else (15.0, 2, 3.0)
    couch = Couch(site.couch.url, user=site.couch.user, password=site.couch.password,
                  timeout=timeout, retries=retries, retry_time=retry_time, site=site.name)
    return couch.database(site.couch.database)


# --- reading ----------------------------------------------------------------------


def read_merged(db: Database, site: str, job_id: str) -> tuple[Doc, list[Doc]]:
    """The job merged from all its live leaves, and the leaves; NoSuchJob when absent,
    NewerFormat when a leaf is of a format this release cannot read."""
    leaves = [leaf for leaf in db.leaves(job_id) if leaf.get("type") == "job"]
    if not leaves:
        raise NoSuchJob(f"no job {job_id!r} at site {site}")
    newest = max(newer_format(leaf) or 0 for leaf in leaves)
    if newest:
        raise NewerFormat(f"job {job_id!r} is of format {newest}, newer than this jobdist "
                          f"reads ({JOB_FORMAT}): use the jobdist of an upgraded site")
    return as_doc(core.merge(leaves)), leaves


def read_merged_many(db: Database, ids: list[str]) -> dict[str, Doc]:
    """Each of these jobs that exists, by id, merged from all its leaves; one request
    for all of them, and one more for each job that has conflicts."""
    docs = {doc["_id"]: doc for doc in db.bulk_get(ids, conflicts=True)}
    for doc_id, doc in docs.items():
        if doc.get("_conflicts"):
            docs[doc_id] = as_doc(core.merge(db.leaves(doc_id)))
    return docs


def awaited_statuses(db: Database, doc: Doc) -> dict[str, str | None]:
    """The status of each job `doc` waits for (its `after`), as this site sees it:
    live, waiting, success, failed, cancelled, or None when the site has no such job
    (not yet replicated here, or no job has that id)."""
    ids = awaited(doc)
    found = read_merged_many(db, ids) if ids else {}
    return {job_id: status_of(found[job_id]) if job_id in found else None for job_id in ids}


def with_conflicts(doc: Doc, leaves: list[Doc]) -> Doc:
    """The merged job as one JSON document: `_id` and `_rev` first, and `_conflicts`
    (the other leaves' revisions) when there are."""
    shown = dict(doc)
    if len(leaves) > 1:
        shown["_conflicts"] = sorted(leaf["_rev"] for leaf in leaves
                                     if leaf["_rev"] != doc["_rev"])
    return {"_id": shown.pop("_id"), "_rev": shown.pop("_rev"), **shown}


# --- listing ----------------------------------------------------------------------


@dataclass(frozen=True)
class JobRow:
    """A job as a listing shows it: one row of the by_status, by_creator or by_site view."""

    id: str
    status: str
    creator: str
    priority: int
    step: int
    steps: int
    created_at: str
    updated_at: str
    command: str
    fan_out: str | None = None  # a broadcast step's "done/sites"


def row_from_summary(doc_id: str, created_at: str, value: Doc) -> JobRow:
    return JobRow(doc_id, value.get("status") or "live", str(value.get("creator")),
                  int(value.get("priority") or 0), int(value.get("step") or 0),
                  int(value.get("steps") or 0), created_at, str(value.get("updated_at") or ""),
                  str(value.get("command")),
                  value["fan_out"] if isinstance(value.get("fan_out"), str) else None)


def summary_of(doc: Leaf) -> Doc:
    """What the by_creator and by_site views emit as a row's value."""
    steps = doc.get("job") or [{}]
    current = steps[min(doc.get("step", 0), len(steps) - 1)]
    return {"status": status_of(doc), "creator": doc.get("creator"),
            "priority": doc.get("priority"), "step": doc.get("step"), "steps": len(steps),
            "updated_at": doc.get("updated_at"), "command": str(current.get("do"))[:120],
            "fan_out": fan_text(current)}


def fan_text(step: Leaf) -> str | None:
    """A broadcast step's fan-out as the views give it: "done/sites"."""
    counts = fan_out(step)
    return None if counts is None else f"{counts[0]}/{counts[1]}"


def status_of(doc: Leaf) -> str:
    """The job's status as the views key it: its final one, else waiting or live."""
    return doc.get("job_status") or ("waiting" if is_waiting(doc) else "live")


def list_jobs(db: Database, *, status: str | None = None, creator: str | None = None,
              site: str | None = None, before: str | None = None,
              page_size: int = 100) -> Iterator[JobRow]:
    """Jobs newest first, read a page at a time from a view, never all at once.

    One descending key range per status (the views key on [..., status,
    created_at]), merged by creation time. `site` reads `by_site`, `creator`
    `by_creator`, otherwise `by_status` with the documents; a creator given
    with a site is checked on the rows.
    """
    statuses = [status] if status else list(STATUSES)
    if site is not None:
        view, prefix = "by_site", [site]
    elif creator is not None:
        view, prefix = "by_creator", [creator]
    else:
        view, prefix = "by_status", []
    check_creator = site is not None and creator is not None
    if check_creator:
        page_size = 200  # rows of other creators are skipped: read more at a time
    streams = [_view_rows(db, view, [*prefix, name], before, page_size) for name in statuses]
    rows = heapq.merge(*streams, key=lambda row: (row.created_at, row.id), reverse=True)
    return (row for row in rows if not check_creator or row.creator == creator)


def _view_rows(db: Database, view: str, prefix: list[Any], before: str | None,
               page_size: int = 100) -> Iterator[JobRow]:
    params: dict[str, Any] = {"descending": True, "endkey": prefix,
                              "startkey": [*prefix, before if before else {}]}
    if view == "by_status":
        params |= {"include_docs": True, "reduce": False}
    for row in iter_view(db, PEOPLE_DDOC, view, page_size=page_size, **params):
        created_at = row["key"][-1]
        if before and created_at >= before:
            continue
        if view == "by_status":
            if not row.get("doc"):
                continue
            yield row_from_summary(row["id"], created_at, summary_of(normalise(row["doc"])))
        else:
            yield row_from_summary(row["id"], created_at, row["value"] or {})


def count_by_status(db: Database) -> dict[str, int]:
    """How many jobs the site holds in each state (live, success, failed, cancelled)."""
    return {row["key"][0]: row["value"] for row in db.view(PEOPLE_DDOC, "by_status", group_level=1)}


@dataclass
class SiteSnapshot:
    """What `watch` shows of a site: jobs by state and the steps running there."""

    site: SiteConfig
    counts: dict[str, int]
    running: list[Doc]  # the `running` view's rows for the site, with their jobs
    error: CouchError | None = None


def snapshot_site(site: SiteConfig) -> SiteSnapshot:
    db = site_database(site, quick=True)
    try:
        running = db.view(PEOPLE_DDOC, "running", startkey=[site.name], endkey=[site.name, {}],
                          include_docs=True)
        return SiteSnapshot(site, count_by_status(db), running)
    except CouchError as error:
        return SiteSnapshot(site, {}, [], error)


# --- writing ----------------------------------------------------------------------


def submit(db: Database, site: str, submission: Any) -> Doc:
    """Store a job made from `submission` with `site` as its creator; the stored job.

    InvalidJob lists every problem; JobExists when its id is taken.
    """
    problems = validate_submission(submission)
    if problems:
        raise InvalidJob(problems)
    job = prepare(submission, site)
    if isinstance(db.save(job), Conflict):
        raise JobExists(f"a job with id {job['_id']!r} exists at site {site} already")
    return job


def prepare(submission: Any, site: str) -> Doc:
    """The job document `submit` would store (for a dry run): InvalidJob if it breaks a rule."""
    job = job_from_submission(submission, site)
    problems = validate_job(job)
    if problems:
        raise InvalidJob(problems)
    return job


@dataclass(frozen=True)
class Cancelled:
    """What a cancel found: the job as read before it wrote, and whether it wrote."""

    job: Doc
    written: bool

    @property
    def running_step(self) -> Doc | None:
        """The current step if it was running (its site kills it when the change arrives)."""
        step = self.job["job"][self.job["step"]]
        return step if step_phase(step) in (Phase.WON, Phase.RUNNING) else None


def cancel(db: Database, site: str, job_id: str, reason: str) -> Cancelled:
    """Cancel a live job (written=False when it had already ended or been cancelled).

    A conflict means someone wrote since we read: read all leaves again and decide
    again; the creator's daemon deletes the losing leaves once it has seen the write.
    """
    for _ in range(WRITE_ATTEMPTS):
        doc, leaves = read_merged(db, site, job_id)
        if doc["job_status"] is not None:
            return Cancelled(doc, written=False)
        plan = core.plan_cancel(leaves, core.Context(site=site, now=utc_now()), reason)
        assert plan.doc is not None, "plan_cancel writes for every live job"
        if isinstance(db.save(plan.doc), Saved):
            return Cancelled(doc, written=True)
    raise StillConflicting(f"cannot cancel {job_id}: still conflicting after "
                           f"{WRITE_ATTEMPTS} tries; try again")


def live_jobs_created_by(db: Database, creator: str) -> list[str]:
    return [row.id for status in ("live", "waiting")
            for row in list_jobs(db, status=status, creator=creator)]


ADOPT_PASSES = 3


def adopt(db: Database, site: str, gone: str, reason: str) -> int:
    """Make `site` the creator of every live job `gone` created; how many it adopted.

    The listing reads each job's winning revision while the site's daemon and
    replication keep writing: a job can be missed by one pass (or found with
    nothing to do yet), so the listing is read again until a pass adopts nothing.
    """
    adopted: set[str] = set()
    for _ in range(ADOPT_PASSES):
        found = [job_id for job_id in live_jobs_created_by(db, gone) if job_id not in adopted]
        done = {job_id for job_id in found if adopt_job(db, site, job_id, gone, reason)}
        if not done:
            break
        adopted |= done
    return len(adopted)


def adopt_job(db: Database, site: str, job_id: str, gone: str, reason: str) -> bool:
    """Write one adoption, reading again after a conflict; False when nothing was due."""
    for _ in range(WRITE_ATTEMPTS):
        # Only the leaves a daemon would merge: an invalid one, or one that defines
        # another job, must not become the adopted job (the creator deletes those).
        leaves, _ = core.usable_leaves([leaf for leaf in db.leaves(job_id)
                                        if leaf.get("type") == "job"])
        plan = core.plan_adopt(leaves, core.Context(site=site, now=utc_now()), gone, reason)
        if plan.doc is None:
            return False
        if isinstance(db.save(plan.doc), Saved):
            return True
    raise StillConflicting(f"cannot adopt {job_id}: still conflicting after "
                           f"{WRITE_ATTEMPTS} tries; run the command again")


# --- broadcast steps ---------------------------------------------------------------


class CannotDrop(JobdistError):
    """A site that cannot be dropped from the job's current step here, and why."""


def drop_site(db: Database, site: str, job_id: str, dropped: str, reason: str) -> Doc:
    """Remove `dropped`, a site lost for good, from the job's current broadcast step, at
    `site`, which must be the job's creator (core.plan_drop); the job as read before.
    Raises CannotDrop with the reason when there is nothing to drop."""
    for _ in range(WRITE_ATTEMPTS):
        leaves, _ = core.usable_leaves([leaf for leaf in db.leaves(job_id)
                                        if leaf.get("type") == "job"])
        if not leaves:
            raise NoSuchJob(f"no job {job_id!r} at site {site}")
        ctx = core.Context(site=site, now=utc_now())
        job = core.merge(leaves)
        problem = core.drop_problem(job, ctx, dropped)
        if problem is not None:
            raise CannotDrop(f"cannot drop {dropped} from {job_id}: {problem}")
        plan = core.plan_drop(leaves, ctx, dropped, reason)
        assert plan.doc is not None, "plan_drop writes when drop_problem finds nothing"
        if isinstance(db.save(plan.doc), Saved):
            return as_doc(job)
    raise StillConflicting(f"cannot drop {dropped} from {job_id}: still conflicting after "
                           f"{WRITE_ATTEMPTS} tries; try again")


# --- schedules --------------------------------------------------------------------


class NoSuchSchedule(JobdistError):
    """The site has no schedule by that name."""


class ScheduleExists(JobdistError):
    """A schedule with the name being added is there already."""


def add_schedule(db: Database, site: str, doc: Doc) -> Doc:
    """Store a new schedule (made by schedules.new_schedule); ScheduleExists if taken."""
    if isinstance(db.save(doc), Conflict):
        raise ScheduleExists(f"a schedule named {doc['name']!r} exists at site {site} "
                             "already: remove it first, or pick another name")
    return doc


def list_schedules(db: Database) -> list[Doc]:
    """Every schedule the site knows, by owner and name (the `schedules` view's rows)."""
    return [{"name": row["key"][1], "owner": row["key"][0], **row["value"]}
            for row in db.view(DDOC, "schedules")]


def read_schedule(db: Database, site: str, name: str) -> Doc:
    doc = db.get(schedule_id(name))
    if doc is None or doc.get("type") != "schedule":
        raise NoSuchSchedule(f"no schedule {name!r} at site {site}")
    return doc


def set_schedule_enabled(db: Database, site: str, name: str, enabled: bool) -> Doc:
    """Pause or resume a schedule; the change's time is its `updated_at`, so the
    ticks it was paused for never run. The schedule as written."""
    for _ in range(WRITE_ATTEMPTS):
        doc = read_schedule(db, site, name)
        if doc.get("enabled", True) == enabled:
            return doc
        changed = {**doc, "enabled": enabled, "updated_at": utc_now()}
        if isinstance(db.save(changed), Saved):
            return changed
    raise StillConflicting(f"cannot change schedule {name!r}: still conflicting after "
                           f"{WRITE_ATTEMPTS} tries; try again")


def remove_schedule(db: Database, site: str, name: str) -> None:
    """Delete a schedule (the jobs it made stay)."""
    for _ in range(WRITE_ATTEMPTS):
        doc = read_schedule(db, site, name)
        if isinstance(db.delete(doc["_id"], doc["_rev"]), Saved):
            return
    raise StillConflicting(f"cannot remove schedule {name!r}: still conflicting after "
                           f"{WRITE_ATTEMPTS} tries; try again")
