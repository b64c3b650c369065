"""The job document: building new jobs and reading their state.

A job is one CouchDB document (docs/job-document.md). This module knows its
shape and nothing about I/O: builders for new jobs, and small readers such as
"which phase is the current step in" that the decision core is written in.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from enum import IntEnum, StrEnum
from typing import Any, Literal, NotRequired, TypedDict, TypeVar, cast

from .clock import utc_now
from .javascript_json import is_number

Doc = dict[str, Any]  # any JSON document as read or written: nothing about it is sure
Leaf = Mapping[str, Any]  # a job's revision as stored, or normalised: a reader takes either
StepKey = tuple[str, int]  # (job id, step index): what a booking or a run is for
_J = TypeVar("_J")

JobStatus = Literal["success", "failed", "cancelled"]
RunStatus = Literal["running", "finished", "failed"]  # a step's (step_status), a sub-run's


# --- the normalised job document (docs/job-document.md), as `normalise` returns it -------
#
# What validate_doc_update.js accepts, with every field that has a default present
# (JOB_DEFAULTS and the others, below); the optional fields without a default are
# NotRequired. Only `normalise` makes a Job of a document: a revision read from the
# server that was not normalised is a `Doc` (or a `Leaf`), and may lack any field.

class Output(TypedDict):
    stdout: str
    stderr: str


class Progress(TypedDict):
    """What the running command last reported (`JOBDIST_PROGRESS 0.4 copying`)."""

    fraction: float
    message: str
    at: str


class RetryStrategy(TypedDict):
    max_retries: int
    max_time: float | None
    sleep: float | None
    sleep_factor: float | None
    sleep_max: float | None


class RunRecord(TypedDict):
    """What an execution records, on its step or on its broadcast sub-run."""

    executioner: str | None
    exec_time: float | None
    start_time: str | None
    finish_time: str | None
    lease_until: str | None
    attempts: int
    exit_code: int | None
    output: Output | None
    progress: Progress | None


class SubRun(RunRecord):
    """One site's part of a broadcast step; `epoch` and site are its fencing token."""

    epoch: int
    status: RunStatus | None


class Step(RunRecord):
    target: str | list[str]
    do: str
    alt_do: str | None
    timeout: float | None
    retry_strategy: RetryStrategy
    epoch: int
    claimed_by: str | None
    winner: str | None
    step_status: RunStatus | None
    # Broadcast steps only (docs/job-document.md, "Broadcast steps").
    each: NotRequired[bool]
    each_policy: NotRequired[str]
    runs: NotRequired[dict[str, SubRun] | None]
    dropped: NotRequired[list[str]]


class Event(TypedDict):
    """A history event: `event` is one of HISTORY_EVENTS."""

    event: str
    step: int
    site: str
    worker: str | None
    epoch: int
    at: str
    detail: str | None  # for people: its wording may change
    reason: NotRequired[str]  # for programs: a Reason code, where one applies


class Tick(TypedDict):
    """The schedule a job was made by, and the tick it is for."""

    name: str
    tick: str


class Job(TypedDict):
    _id: str
    _rev: NotRequired[str]  # every revision read from the server has one
    _conflicts: NotRequired[list[str]]
    _deleted: NotRequired[bool]
    type: str
    creator: str
    priority: int
    created_at: str | None
    updated_at: str | None
    step: int
    job_status: JobStatus | None
    job: list[Step]
    history: list[Event]
    keepalive_at: NotRequired[str]
    meta: NotRequired[dict[str, Any]]
    schedule: NotRequired[Tick]
    after: NotRequired[list[str]]
    after_policy: NotRequired[str]
    not_before: NotRequired[str | None]
    format: NotRequired[int]


# The newest job document format this jobdist reads and writes (docs/job-document.md,
# "Format"). A job of format 1 leaves `format` out, so that the validators of
# releases before the field accept it; a release that changes what a job means
# raises this and writes `format` on the jobs that need it. A daemon leaves a job
# of a newer format alone (core.usable_leaves): it cannot tell what it means.
JOB_FORMAT = 1


def newer_format(doc: Leaf) -> int | None:
    """The document's format when it is newer than this jobdist reads, else None."""
    version: Any = doc.get("format")  # (absent, the common case, costs no call)
    if version is None or not is_number(version) or not float(version).is_integer():
        return None
    return int(version) if version > JOB_FORMAT else None


ANY = "any"
ALL = "all"  # a broadcast step's target: every site the creator knows when it opens the step
FINAL_STATUSES = ("success", "failed", "cancelled")
HISTORY_EVENTS = (
    "created", "claimed", "won", "started", "retried", "finished", "failed",
    "released", "cancelled", "stale_finish", "invalid", "adopted", "ready", "opened",
    "dropped",
)


class Reason(StrEnum):
    """Why a site released, failed or started a step, as a code that programs act on
    (an event's `reason`, a plan's): the event's `detail` says it in words that may
    change. docs/job-document.md, "History events", lists them."""

    WON_CLAIM = "won_claim"  # a start on a win the creator gave us (plans only)
    LATE_START = "late_start"  # a start written after its run was launched (plans only)
    NO_WORKER = "no_worker"  # a win given back: no worker free, and the site queues none
    NO_WORKER_IN_TIME = "no_worker_in_time"  # queued for half its start-by lease
    QUEUE_FULL = "queue_full"  # no worker free, and the site's queue full
    WIN_LAPSED = "win_lapsed"  # the win's start-by lease had passed when it arrived
    START_LAPSED = "start_lapsed"  # a run launched ahead whose start came too late
    WAITED_FOR = "waited_for"  # the job failed: a job it waited for failed or was cancelled
    ALT_DO = "alt_do"  # the step succeeded by its alt_do after its do failed


EVENT_REASONS = tuple(reason.value for reason in Reason)  # what validation accepts

# Waiting for other jobs and for a time (docs/job-document.md, "Waiting").
AFTER_POLICIES = ("success", "always")  # the first is the default
MAX_AFTER = 100  # jobs one job may wait for


def new_job_id(created_at: str) -> str:
    """`job-<compact creation time>-<random>`: ids sort by creation time."""
    compact = created_at.replace("-", "").replace(":", "")
    return f"job-{compact}-{secrets.token_hex(4)}"


def new_step(
    do: str,
    *,
    target: str | list[str] = ANY,
    alt_do: str | None = None,
    timeout: float | None = None,
    max_retries: int = 0,
    max_time: float | None = None,
    sleep: float | None = None,
    sleep_factor: float | None = None,
    sleep_max: float | None = None,
    each: bool = False,
    each_policy: str | None = None,
) -> Doc:
    """A step as a submitter writes it; the runtime fields get their initial values.
    `each` and `each_policy` (broadcast steps) are written only when set."""
    broadcast: Doc = {"each": True} if each else {}
    if each_policy is not None:
        broadcast["each_policy"] = each_policy
    return initial_step({**broadcast,
        "target": target,
        "do": do,
        "alt_do": alt_do,
        "timeout": timeout,
        "retry_strategy": {
            "max_retries": max_retries,
            "max_time": max_time,
            "sleep": sleep,
            "sleep_factor": sleep_factor,
            "sleep_max": sleep_max,
        },
    })


# Defaults of the fields a job may leave out (docs/job-document.md, "Defaults"): a
# job written over CouchDB's HTTP API need hold only what its submitter writes.
# validate_doc_update.js holds the same tables (tests/test_validation.py compares
# them): a field with a default is never required. `normalise` fills them in.
JOB_DEFAULTS: dict[str, Any] = {
    "priority": 0,
    "created_at": None,  # until the creator accepts the job: its first write stamps it
    "updated_at": None,  # until a site first writes the job
    "step": 0,
    "job_status": None,
    "history": [],
}
STEP_DEFAULTS: dict[str, Any] = {
    "target": ANY,
    "alt_do": None,
    "timeout": None,
    "retry_strategy": {},
    "epoch": 0,
    "claimed_by": None,
    "winner": None,
    "executioner": None,
    "step_status": None,
    "exec_time": None,
    "start_time": None,
    "finish_time": None,
    "lease_until": None,
    "attempts": 0,
    "exit_code": None,
    "output": None,
    "progress": None,  # {fraction, message, at}: what the running command last reported
}
RETRY_DEFAULTS: dict[str, Any] = {
    "max_retries": 0,
    "max_time": None,
    "sleep": None,
    "sleep_factor": None,
    "sleep_max": None,
}
EVENT_DEFAULTS: dict[str, Any] = {"worker": None, "epoch": 0, "detail": None}


def normalise(doc: Leaf) -> Job:
    """The job with every field it leaves out at its default: what every reader sees.

    Applied where a job enters the decision core (core.usable_leaves, core.merge,
    core.keepalive) and the analytics, so that no reader keeps its own defaults.
    `doc` itself is never changed: the result is `doc` when nothing is missing,
    else a copy. A malformed document is filled only where its shape allows (and
    is no Job, whatever the type says: the decision core only normalises documents
    that validate_job accepts).
    """
    filled = with_defaults(doc, JOB_DEFAULTS)
    for name, fill in (("job", normalise_step), ("history", normalise_event)):
        items = filled.get(name)
        if isinstance(items, list):
            done = [fill(item) if isinstance(item, dict) else item for item in items]
            if any(new is not old for new, old in zip(done, items, strict=True)):
                filled = {**filled, name: done}
    return cast(Job, filled)


def normalise_step(step: Leaf) -> Leaf:
    filled = with_defaults(step, STEP_DEFAULTS)
    strategy = filled["retry_strategy"]
    if isinstance(strategy, dict) and (full := with_defaults(strategy, RETRY_DEFAULTS)) \
            is not strategy:
        filled = {**filled, "retry_strategy": full}
    return filled


def normalise_event(entry: Leaf) -> Leaf:
    return with_defaults(entry, EVENT_DEFAULTS)


def json_copy(value: _J) -> _J:
    """A deep copy of a JSON value (dicts, lists and scalars), six times as fast as
    copy.deepcopy, which the decision core called several times a decision."""
    if isinstance(value, dict):
        return cast(_J, {key: json_copy(item) for key, item in value.items()})
    if isinstance(value, list | tuple):  # (a tuple, from Python code, becomes a list)
        return cast(_J, [json_copy(item) for item in value])
    return value


def with_defaults(obj: Leaf, defaults: Doc) -> Leaf:
    """`obj`, or a copy of it with the fields it lacks set to their defaults."""
    missing = [name for name in defaults if name not in obj]
    if not missing:
        return obj
    return {**obj, **{name: json_copy(defaults[name]) for name in missing}}


def as_doc(job: Job) -> Doc:
    """A job where any document goes (the readers outside the decision core: the CLI,
    retention): the same dict, its fields no longer checked."""
    return cast(Doc, job)


def is_accepted(doc: Leaf) -> bool:
    """Has the creator accepted the job (stamped its creation time)? A job written
    over HTTP without one waits for its creator: see core.plan."""
    return doc.get("created_at") is not None


def initial_step(step: Doc) -> Doc:
    """A submitted step with every field it lacks set to its default."""
    return cast(Doc, normalise_step(json_copy(step)))  # the copy, or a copy of it


def new_job(
    creator: str,
    steps: list[Doc],
    *,
    priority: int = 0,
    created_at: str | None = None,
    job_id: str | None = None,
    meta: Doc | None = None,
    waits: Doc | None = None,
) -> Doc:
    """A complete job document, ready to save at the creator's site; `meta` is the
    submitter's own data, kept as it is; `waits` its `after`, `after_policy` and
    `not_before`, those it sets (see is_waiting)."""
    created_at = created_at or utc_now()
    doc = {
        "_id": job_id or new_job_id(created_at),
        "type": "job",
        "creator": creator,
        "priority": priority,
        "created_at": created_at,
        "updated_at": created_at,
        "step": 0,
        "job_status": None,
        "job": [initial_step(step) for step in steps],
        "history": [event("created", step=0, site=creator, at=created_at)],
    }
    if meta is not None:
        doc["meta"] = json_copy(meta)
    doc.update(json_copy(waits or {}))
    return doc


def job_from_submission(submission: Doc, creator: str) -> Doc:
    """A job document from what a user submitted (steps, priority, optional _id and meta)."""
    return new_job(
        creator,
        submission["job"],
        priority=submission.get("priority", 0),
        job_id=submission.get("_id"),
        meta=submission.get("meta"),
        waits={name: submission[name] for name in WAIT_FIELDS if name in submission},
    )


# --- waiting: for other jobs to end, for a time ------------------------------------

WAIT_FIELDS = ("after", "after_policy", "not_before")


def awaited(doc: Leaf) -> list[str]:
    """The ids of the jobs this one waits for (`after`; absent: none)."""
    after = doc.get("after")
    return list(after) if isinstance(after, list) else []


def after_policy(doc: Leaf) -> str:
    """`success` (the default): every awaited job must succeed; `always`: they must end."""
    return str(doc.get("after_policy") or AFTER_POLICIES[0])


def is_waiting(doc: Leaf) -> bool:
    """Does the job wait, not claimable by anyone, for its creator to release it?

    It waits when it names jobs to wait for or a time not to start before, until
    its creator records a `ready` event (core.wait.on_waiting). Decided by the document's
    own history, which only grows (the merge takes the union), so a site that
    sees the job before the release never takes it early, and one that has seen
    the release never goes back.
    """
    if not awaited(doc) and not doc.get("not_before"):
        return False
    history = doc.get("history")
    return not any(isinstance(entry, dict) and entry.get("event") == "ready"
                   for entry in (history if isinstance(history, list) else []))


def event(
    name: str,
    *,
    step: int,
    site: str,
    at: str,
    worker: str | None = None,
    epoch: int = 0,
    detail: str | None = None,
    reason: Reason | None = None,
) -> Event:
    entry: Event = {
        "event": name, "step": step, "site": site, "worker": worker,
        "epoch": epoch, "at": at, "detail": detail,
    }
    if reason is not None:
        entry["reason"] = reason.value  # (a plain string in the document)
    return entry


class Phase(IntEnum):
    """Where the current step is; the order is the order of progress."""

    OPEN = 0      # nobody asked for it
    CLAIMED = 1   # a site asked (claimed_by); the creator has not chosen yet
    WON = 2       # the creator chose a winner for this epoch
    RUNNING = 3   # the winner started it
    DONE = 4      # finished or failed


def step_phase(step: Leaf) -> Phase:
    status = step.get("step_status")
    if status in ("finished", "failed"):
        return Phase.DONE
    if status == "running":
        return Phase.RUNNING
    if step.get("winner"):
        return Phase.WON
    if step.get("claimed_by"):
        return Phase.CLAIMED
    return Phase.OPEN


def is_live(doc: Leaf) -> bool:
    return doc.get("job_status") is None and doc["step"] < len(doc["job"])


def current_step(doc: Leaf) -> Doc | None:
    return doc["job"][doc["step"]] if is_live(doc) else None


def targets(step: Leaf) -> list[str]:
    target = step["target"]
    return list(target) if isinstance(target, list) else [target]


def allows(step: Leaf, site: str) -> bool:
    """May `site` run this step?"""
    wanted = targets(step)
    return ANY in wanted or ALL in wanted or site in wanted


def sole_target(step: Leaf) -> str | None:
    """The one site a step may run on, when there is exactly one."""
    wanted = targets(step)
    return wanted[0] if len(wanted) == 1 and wanted[0] != ANY else None


# --- broadcast steps (docs/job-document.md, "Broadcast steps") ---------------------

EACH_POLICIES = ("all", "any")  # all: every site must succeed; any: one site is enough
RUN_STATUSES = (None, "running", "finished", "failed")  # a step's step_status, a sub-run's


def is_broadcast(step: Leaf) -> bool:
    """Does the step run once at each of its sites (target "all", or a list with `each`)?"""
    return step.get("target") == ALL or step.get("each") is True


def each_policy(step: Leaf) -> str:
    return step.get("each_policy") or "all"


def new_sub_run() -> SubRun:
    """One site's part of a broadcast step, as the creator opens it: not started."""
    return {
        "epoch": 0, "status": None, "executioner": None, "start_time": None,
        "finish_time": None, "exec_time": None, "lease_until": None, "attempts": 0,
        "exit_code": None, "output": None, "progress": None,
    }


def sub_runs(step: Leaf) -> dict[str, SubRun]:
    """The step's sub-runs by site ({} until the creator opens it)."""
    runs = step.get("runs")
    return runs if isinstance(runs, dict) else {}


def dropped_sites(step: Leaf) -> list[str]:
    """The sites an operator removed from the step's set (`jobdist drop-site`)."""
    return list(step.get("dropped") or [])


def counting_runs(step: Leaf) -> dict[str, SubRun]:
    """The sub-runs the step waits for: every site's but the dropped ones'."""
    dropped = set(dropped_sites(step))
    return {site: run for site, run in sub_runs(step).items() if site not in dropped}


def fan_out(step: Leaf) -> tuple[int, int] | None:
    """(sites done, sites counted) of an opened broadcast step; None for any other step."""
    if not is_broadcast(step) or step.get("runs") is None:
        return None
    runs = counting_runs(step)
    return sum(run.get("status") in ("finished", "failed") for run in runs.values()), len(runs)
