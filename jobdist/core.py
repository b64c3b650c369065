"""The decision core: what one site does about one job. Pure: no I/O, no clock.

Every site runs the same rules on the same inputs: the live leaf revisions of a
job document (all of them, not only CouchDB's winner), the site's name and the
state of its workers. The answer is a Plan: at most one new revision to write
on top of CouchDB's winning leaf, the losing leaves to delete (the creator
alone does that), and local effects to carry out before and after the write.

Why all leaves and not the winner alone: CouchDB picks the winner of
concurrent revisions by history length and then by hash, which knows nothing
of our protocol: a stale claim or a keep-alive re-save can beat the creator's
assignment on the hash. We order leaves by *progress* instead: per step the
claim epoch, then the phase (open < claimed < won < running < done), earlier
steps first. Epochs only grow, and only an assignment, a direct start or a
release raises one, so the merge of all leaves is the furthest any site has
got, and every site that has the same leaves derives the same state. The
epoch is also the fencing token: an execution whose epoch is not the step's
current one can never advance the job (see `plan_finish`).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from .clock import later, parse_time, seconds_between
from .model import (
    ALL,
    ANY,
    Doc,
    Event,
    Job,
    Leaf,
    Phase,
    Progress,
    RunRecord,
    RunStatus,
    Step,
    StepKey,
    SubRun,
    after_policy,
    allows,
    awaited,
    counting_runs,
    dropped_sites,
    each_policy,
    event,
    is_accepted,
    is_broadcast,
    is_held,
    is_live,
    json_copy,
    new_sub_run,
    normalise,
    sole_target,
    step_phase,
    sub_runs,
    targets,
)
from .validation import (
    MAX_DOC_SIZE,
    format_errors,
    is_integer,
    is_iso_utc,
    json_length,
    json_size,
    json_size_over,
    validate_job,
)

Unusable = tuple[str, str]  # (leaf rev, why no site may act on it)


# --- inputs -----------------------------------------------------------------

@dataclass(frozen=True)
class Booking:
    worker: str
    age: float  # seconds since the worker was booked


@dataclass(frozen=True)
class Running:
    worker: str
    epoch: int
    # For a run launched ahead: when it was launched (ISO), the time its start records
    # however late it is written. Not part of a run's identity.
    launched_at: str | None = field(default=None, compare=False)
    # For a run launched ahead: the end of the step before that its start followed
    # (follows); None when unknown.
    after: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Rider:
    """A run chained onto the end (in `end_epoch`) of the step before, neither of them
    written yet: the end's record starts it (chain_next), nothing else does."""

    worker: str
    epoch: int
    end_epoch: int


@dataclass(frozen=True)
class PoolView:
    """What the site's workers are doing, as the manager knows it."""

    free_workers: tuple[str, ...] = ()
    booked: Mapping[StepKey, Booking] = field(default_factory=dict)
    running: Mapping[StepKey, Running] = field(default_factory=dict)
    # Steps won here that wait for a worker, and how long each has waited by this
    # site's clock (see queues); at most `queue_limit` (0: a win no worker is free
    # for is released at once, as in the thesis).
    queued: Mapping[StepKey, float] = field(default_factory=dict)
    queue_limit: int = 0
    # Of `running`, the executions launched ahead of their start whose start is not
    # written yet (see record_late_start); those chained onto an end are `riding`.
    ahead: Mapping[StepKey, Running] = field(default_factory=dict)
    riding: Mapping[StepKey, Rider] = field(default_factory=dict)
    # How long the longest free of `free_workers` has been free, by this site's clock
    # (None: not known). Claims wait on it (holds_claims).
    idle_for: float | None = None

    def worker_for(self, key: StepKey) -> str | None:
        """The worker booked for key, else a free one, else None."""
        if key in self.booked:
            return self.booked[key].worker
        return self.free_workers[0] if self.free_workers else None

    def oldest_undecided(self) -> tuple[StepKey, str] | None:
        """The booking made longest ago: bookings back claims the creator has not decided."""
        if not self.booked:
            return None
        key = max(self.booked, key=lambda k: self.booked[k].age)
        return key, self.booked[key].worker


# The protocol's timing defaults, in seconds; a site's [daemon] settings override them.
BOOKING_TIMEOUT = 60.0
LEASE = 60.0
HEARTBEAT = 15.0
SKEW_MARGIN = 10.0
CREATOR_TIMEOUT = 120.0  # seconds of a creator's silence before its successor takes over
CLAIM_DELAY = 2.0  # seconds an assigning creator's open step is left to it (Context)
FED_CLAIM_DELAY = 10.0  # the same, while that creator is feeding this site (Context.fed_by)


@dataclass(frozen=True)
class Context:
    site: str
    now: str  # ISO 8601 UTC, from the caller's clock
    known_sites: frozenset[str] | None = None  # when set, the creator fails jobs no site can run
    booking_timeout: float = BOOKING_TIMEOUT  # free a booked worker whose claim is undecided
    lease: float = LEASE  # a winner's promise lasts this long unless renewed by its heartbeat
    skew_margin: float = SKEW_MARGIN  # the creator waits this much past a lease: clocks differ
    # How long this site has seen each `lease_until` of the job unchanged, by its
    # own clock (None: not tracked). A lease past its deadline is revoked only once
    # it has also been silent that long for `lease` + `skew_margin`: a winner whose
    # renewals arrive keeps its step whatever the clocks say, and a creator back
    # from an outage, whose copy may be stale, first gives renewals time to arrive.
    lease_silence: Mapping[str, float] | None = None
    # The site's command allow-list (None: any command). A site does not take a
    # step whose command it would refuse, unless it is the step's only target.
    runs: Callable[[str], bool] | None = None
    # For a creator: how many more steps each other site has room for now, from
    # the sites' status documents less what we assigned since (None: unknown, so
    # open steps wait for claims, as in the thesis).
    room: Mapping[str, int] | None = None
    # Of that room, how many workers each site had free (the rest is its queue).
    idle: Mapping[str, int] = field(default_factory=dict)
    # For the other sites: creators whose fresh status says they assign open steps
    # to sites with room. Their steps are claimed only once open, and a worker of ours
    # free (PoolView.idle_for), for `claim_delay` seconds: a claim would mostly lose to
    # the assignment, and book a worker meanwhile.
    assigning: frozenset[str] = frozenset()
    claim_delay: float = CLAIM_DELAY
    # Of those, the creators that gave this site a step within the last `claim_delay`
    # seconds of its own clock: live, and giving it work as they learn of its room.
    # Their steps are claimed only once open, and a worker free, for `fed_claim_delay`:
    # a claim would race their next assignment and cost two revisions more (a claim,
    # then a win) for the same start. The bound keeps a belief that is wrong from
    # holding a step for ever.
    fed_by: frozenset[str] = frozenset()
    fed_claim_delay: float = FED_CLAIM_DELAY
    # Automatic succession: each creator's successors, in order (config
    # `[succession] successors`), and the sites none of whose statuses has been new
    # to this site for `creator_timeout` seconds of its own clock (never itself).
    successors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    silent: frozenset[str] = frozenset()
    creator_timeout: float = CREATOR_TIMEOUT
    # How long this site has seen the job's leaves unchanged, by its own clock (None:
    # not tracked). A job is taken over only once it too has been still that long: a
    # creator back from silence whose new job outran its status keeps the job.
    unchanged_for: float | None = None
    # For a creator: the final status (success, failed, cancelled) of each job its
    # waiting jobs name that has ended, as this site's CouchDB shows it (the merge
    # of its leaves); a job absent here has not ended, or has not reached us yet.
    ended: Mapping[str, str] = field(default_factory=dict)

    def lease_expired(self, step: RunRecord) -> bool:
        deadline = step.get("lease_until")
        if not deadline or seconds_between(deadline, self.now) <= self.skew_margin:
            return False
        if self.lease_silence is None:
            return True
        return self.lease_silence.get(deadline, 0.0) > self.lease + self.skew_margin


class StepOutcome(Protocol):
    """What a worker reports (jobdist.workers.StepResult has these fields), read-only."""

    @property
    def ok(self) -> bool: ...

    @property
    def used_alt(self) -> bool: ...

    @property
    def exit_code(self) -> int | None: ...

    @property
    def attempts(self) -> int: ...

    @property
    def exec_time(self) -> float: ...

    @property
    def start_time(self) -> str: ...

    @property
    def finish_time(self) -> str: ...

    @property
    def stdout(self) -> str: ...

    @property
    def stderr(self) -> str: ...

    @property
    def reason(self) -> str: ...

    @property
    def cancelled(self) -> bool: ...

    @property
    def progress(self) -> Progress | None: ...  # the last {fraction, message, at} it printed


# --- outputs ----------------------------------------------------------------

@dataclass(frozen=True)
class Book:
    key: StepKey
    worker: str


@dataclass(frozen=True)
class Unbook:
    key: StepKey


@dataclass(frozen=True)
class Launch:
    key: StepKey
    epoch: int
    worker: str
    ahead: bool = field(default=False, compare=False)  # may run before its start is written
    # Chained onto the end of the step before (the end's epoch), in the same revision:
    # if that write is lost, the run rides on the held end (PlanRunner.riding).
    chained_on: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Kill:
    key: StepKey
    reason: str


@dataclass(frozen=True)
class Assign:
    """The creator gave a step to `site` on its published room: count it against that room."""

    key: StepKey
    site: str


@dataclass(frozen=True)
class Revoke:
    """The creator took a step back from `site`, silent past its lease: assign it nothing
    more until it says again that it has room (a new status)."""

    key: StepKey
    site: str


@dataclass(frozen=True)
class Queue:
    """A step won here with no worker free: hold it, and start it when one frees."""

    key: StepKey


Effect = Book | Unbook | Launch | Kill | Assign | Revoke | Queue


@dataclass(frozen=True)
class Plan:
    action: str  # for logs and metrics: claim, assign, start, release, fail, ...
    doc: Job | None = None  # the revision to write on top of the winning leaf
    deletions: tuple[str, ...] = ()  # losing leaf revs the creator deletes
    before: tuple[Effect, ...] = ()  # carried out before the write
    after: tuple[Effect, ...] = ()  # carried out once the write is acknowledged
    detail: str = ""

    @property
    def writes(self) -> bool:
        return self.doc is not None or bool(self.deletions)


NOTHING = Plan("none")
WON_CLAIM = "won the claim"  # the detail of a start the creator assigned to us


# --- merging leaves ---------------------------------------------------------

def couch_order(doc: Leaf) -> tuple[int, str]:
    """CouchDB's own winner order: longest history, then highest rev string."""
    number, digest = doc["_rev"].split("-", 1)
    return int(number), digest


def progress(doc: Job) -> tuple[tuple[int, int], ...]:
    return tuple((step.get("epoch", 0), int(step_phase(step))) for step in doc["job"])


def term(doc: Job) -> int:
    """The highest adoption term the job's history knows (0: none)."""
    return max((entry.get("epoch", 0) for entry in doc.get("history", [])
                if entry["event"] == "adopted"), default=0)


def succeeded(doc: Job) -> bool:
    """A leaf where the job succeeded outranks any other, however far along by epochs.

    Every step of it ran, in order, and counted once on that branch. Another branch
    may hold a higher epoch at an early step: a creator cut off revoked a lease whose
    run then finished (issue 10: a result, once a step has ended, is never dropped),
    or a creator cut off and its successor both moved the job on. Taking that branch
    would run a finished job's steps again. Its runs are fenced off as any stale run:
    killed, recorded. A failed or cancelled leaf has no such right: a release still
    beats a revoked run's failure (the step is retried).
    """
    return doc.get("job_status") == "success"


def merge(leaves: Sequence[Leaf]) -> Job:
    """One view of a job from all its live leaves; `_rev` is CouchDB's winner.

    Each leaf is read with its missing fields at their defaults (model.normalise).
    """
    jobs = [normalise(leaf) for leaf in leaves]
    winner = max(jobs, key=couch_order)
    furthest = max(jobs, key=lambda leaf: (succeeded(leaf), progress(leaf), couch_order(leaf)))
    merged = json_copy(furthest)
    merged["_rev"] = winner["_rev"]
    if len(jobs) == 1:
        return merged
    merged["history"] = union_history(jobs)
    merged["updated_at"] = max(leaf["updated_at"] or "" for leaf in jobs) or None
    # A write made before the creator accepted the job has no creation time (see plan).
    merged["created_at"] = max(leaf["created_at"] or "" for leaf in jobs) or None
    # An epoch once issued is never issued again, even when the branch that
    # issued it loses (a step chained on top of a finish that was revoked):
    # otherwise two executions of one step could share a fencing token. Epochs are
    # issued at the current step and later ones only; a step that ended keeps the
    # epoch of the run that counted.
    for index, step in enumerate(merged["job"][merged["step"]:], start=merged["step"]):
        step["epoch"] = max(leaf["job"][index].get("epoch", 0) for leaf in jobs)
    for index, step in enumerate(merged["job"]):
        step["progress"] = latest_progress(jobs, index, step)
    merge_sub_runs(merged, jobs)
    touched = [leaf["keepalive_at"] for leaf in jobs if leaf.get("keepalive_at")]
    if touched:
        merged["keepalive_at"] = max(touched)
    # An adoption outranks whatever the gone creator wrote meanwhile (plan_adopt).
    adoptions = [entry for entry in merged["history"] if entry["event"] == "adopted"]
    if adoptions:
        # (`epoch` is optional in an event: a foreign write may leave it out.)
        latest = max(adoptions,
                     key=lambda entry: (entry.get("epoch", 0), entry["at"], entry["site"]))
        merged["creator"] = latest["site"]
    # A cancellation is an operator's order: it survives any concurrent write
    # except the job having really ended first.
    if merged["job_status"] is None and any(
        leaf.get("job_status") == "cancelled" for leaf in jobs
    ):
        merged["job_status"] = "cancelled"
    return merged


def latest_progress(leaves: list[Job], index: int, step: Step) -> Progress | None:
    """The newest progress any leaf holds for the merged step's own execution.

    A progress write can lose to a concurrent write on the same revision (a
    cancellation, an adoption) that carries the older value; an execution of
    another epoch or winner (a stale or released run) never lends its own.
    """
    reports = [report for leaf in leaves
               if (report := leaf["job"][index].get("progress"))
               and leaf["job"][index].get("epoch", 0) == step.get("epoch", 0)
               and leaf["job"][index].get("winner") == step.get("winner")]
    return max(reports, key=lambda report: str(report.get("at")), default=None)


def union_history(leaves: list[Job]) -> list[Event]:
    seen: dict[str, Event] = {}
    # Leaves in CouchDB's order, so events of equal time keep one order on every site.
    for leaf in sorted(leaves, key=couch_order):
        for entry in leaf.get("history", []):
            seen.setdefault(json.dumps(entry, sort_keys=True), entry)
    return sorted(seen.values(), key=lambda entry: entry["at"])


def same_content(a: Job, b: Job) -> bool:
    strip = ("_rev", "_conflicts")
    return {k: v for k, v in a.items() if k not in strip} == {
        k: v for k, v in b.items() if k not in strip
    }


def usable_leaves(leaves: list[Doc], errors_of: Callable[[Doc], list[str]] = validate_job,
                  ) -> tuple[list[Job], list[Unusable]]:
    """The leaves to merge, and why each other leaf is left out.

    A leaf that breaks the rules (written where validation was off) is left
    out, and so is a valid one that defines another job than the winning valid
    leaf (other creation time or steps): merging those mixes two jobs. (Not the
    creator: an adoption changes it.) `errors_of` is validate_job, or a memo of it.
    The rules judge each leaf as stored; the usable ones are returned normalised
    (model.normalise): from here on every reader sees a field's default.
    """
    valid: list[Job] = []
    rejected: list[Unusable] = []
    for leaf in leaves:
        errors = errors_of(leaf)
        if errors:
            rejected.append((leaf["_rev"], format_errors(errors)))
        else:
            valid.append(normalise(leaf))
    if not valid:
        return [], rejected
    reference = max(valid, key=couch_order)
    usable: list[Job] = []
    for job in valid:
        if job is reference or same_job(job, reference):
            usable.append(job)
        else:
            reason = f"defines another job than revision {reference['_rev']}"
            rejected.append((job["_rev"], reason))
    return usable, rejected


SUBMITTED_STEP_FIELDS = ("target", "do", "alt_do", "timeout", "retry_strategy", "each",
                         "each_policy")


def same_job(leaf: Job, reference: Job) -> bool:
    """The same steps, and the same creation time once both have one: a write made
    before the creator accepted the job (stamped its creation time) has none."""
    times = {leaf["created_at"], reference["created_at"]} - {None}
    return len(times) <= 1 and definition(leaf) == definition(reference)


def definition(doc: Job) -> str:
    """The steps as the submitter fixed them for good: no write by any site changes them."""
    steps: list[dict[str, Any]] = [{name: step.get(name) for name in SUBMITTED_STEP_FIELDS}
                                   for step in doc["job"]]
    for step in steps:  # an unset retry setting and a null one are the same
        step["retry_strategy"] = {k: v for k, v in step["retry_strategy"].items() if v is not None}
    return json.dumps(steps, sort_keys=True)


# --- planning ---------------------------------------------------------------

Edit = Callable[[Job], None]


@dataclass(frozen=True)
class Decision:
    action: str
    edit: Edit | None = None
    before: tuple[Effect, ...] = ()
    after: tuple[Effect, ...] = ()
    detail: str = ""


STAY = Decision("none")


def plan(leaves: Sequence[Leaf], ctx: Context, pool: PoolView,
         rejected: Sequence[Unusable] = ()) -> Plan:
    """What this site does about the job whose usable leaves these are.

    `rejected` are the job's other leaves (see usable_leaves): the creator
    records each in the history as `invalid` and deletes it.
    """
    if not leaves:
        return NOTHING
    merged = merge(leaves)
    decision = decide(merged, ctx, pool)
    if decision == STAY and left_live_by_a_silent_creator(leaves, merged, ctx):
        decision = adopt(merged, ctx, f"{silence(merged, ctx)} (automatic succession: "
                         f"{SHOWN_LIVE})")
        merged = {**merged, "creator": ctx.site}  # we clean its conflicts now (finalize)
    if ctx.site == merged["creator"] and not is_accepted(merged):
        decision = accepting(decision, ctx)
    return finalize(leaves, merged, decision, ctx, rejected)


SHOWN_LIVE = "the job ended, but its winning revision still shows it live"


def shown_live_after_end(leaves: Sequence[Leaf], merged: Job) -> bool:
    """Has the job ended (the merge) while CouchDB's winning leaf still says it is live?

    Only the creator cleans conflicts (finalize), and views read the winning leaf:
    if the creator is gone, such a job shows live forever, and a live winner is
    never written again (every site's merge says the job ended).
    """
    return not is_live(merged) and is_live(normalise(max(leaves, key=couch_order)))


def left_live_by_a_silent_creator(leaves: Sequence[Leaf], merged: Job, ctx: Context) -> bool:
    """Has the job ended while CouchDB's winning leaf still says it is live, its creator
    silent, and is it our turn to take it over (succeeds)?

    A creator that ended the job on its branch and died before it deleted a longer
    live branch (its predecessor's, which renewed a lease meanwhile) leaves it so.
    """
    return shown_live_after_end(leaves, merged) and succeeds(merged, ctx)


def accepting(decision: Decision, ctx: Context) -> Decision:
    """The decision, in a revision that also accepts the job.

    A job written over HTTP may leave out its creation time. Its creator's
    first revision stamps it, whatever else it does: a creation time set by
    one site only, so that every leaf agrees on it (same_job). The other sites
    leave the job alone until then (decide).
    """
    action = decision.action if decision.edit is not None else "accept"
    then = decision.edit

    def edit(doc: Job) -> None:
        doc["created_at"] = ctx.now
        doc["history"].append(event("created", step=doc["step"], site=ctx.site, at=ctx.now,
                                    detail="accepted: written without a creation time"))
        if then is not None:
            then(doc)

    return dataclasses.replace(decision, action=action, edit=edit)


def finalize(leaves: Sequence[Leaf], merged: Job, decision: Decision, ctx: Context,
             rejected: Sequence[Unusable] = ()) -> Plan:
    """Turn a decision into the revision to write; the creator also cleans conflicts."""
    doc = None
    if decision.edit is not None:
        doc = json_copy(merged)
        decision.edit(doc)
        doc["updated_at"] = ctx.now
    deletions: tuple[str, ...] = ()
    if ctx.site == merged["creator"] and len(leaves) > 1:
        deletions = tuple(leaf["_rev"] for leaf in leaves if leaf["_rev"] != merged["_rev"])
        base = normalise(next(leaf for leaf in leaves if leaf["_rev"] == merged["_rev"]))
        if doc is None and not same_content(base, merged):
            doc = merged  # the winning leaf alone would lose progress: write the merge
    if ctx.site == merged["creator"] and rejected:
        if doc is None:
            doc = json_copy(merged)
            doc["updated_at"] = ctx.now
        record_rejected(doc, ctx, rejected)
        deletions += tuple(rev for rev, _ in rejected)
    action = decision.action
    if action == "none" and (doc is not None or deletions):
        action = "resolve"
    if doc is not None:
        doc.pop("_conflicts", None)
        fit(doc, keep_events_from=len(merged["history"]))
    return Plan(action, doc, deletions, decision.before, decision.after, decision.detail)


def record_rejected(doc: Job, ctx: Context, rejected: Sequence[Unusable]) -> None:
    """An `invalid` event per rejected leaf, once: a deletion that failed is tried again."""
    index = min(doc["step"], len(doc["job"]) - 1)
    for rev, reason in rejected:
        detail = f"revision {rev} skipped: {reason}"[:MAX_DETAIL]
        if not any(entry["event"] == "invalid" and (entry.get("detail") or "").startswith(
                f"revision {rev} ") for entry in doc["history"]):
            doc["history"].append(event("invalid", step=index, site=ctx.site, at=ctx.now,
                                        detail=detail))


def decide(doc: Job, ctx: Context, pool: PoolView) -> Decision:
    """The one thing to do about a job, given its merged view."""
    local = settle_local_work(doc, ctx, pool)
    if local is not None:
        return local
    if not is_live(doc):
        return STAY
    if not known(doc["creator"], ctx):
        return on_unknown_creator(doc, ctx)
    if succeeds(doc, ctx):
        return adopt(doc, ctx, f"{silence(doc, ctx)} (automatic succession)")
    if not is_accepted(doc) and ctx.site != doc["creator"]:
        return STAY  # until its creator accepts it (see accepting)
    if is_held(doc):
        return on_held(doc, ctx, pool)
    step = doc["job"][doc["step"]]
    if ctx.site == doc["creator"] and not runnable_anywhere(step, ctx):
        return Decision("fail", fail_job(ctx, f"no known site matches target {step['target']!r}"))
    if is_broadcast(step) and step_phase(step) < Phase.DONE:
        return on_broadcast(doc, step, ctx, pool)
    holder = step_holder(step)
    waiting = Phase.OPEN < step_phase(step) < Phase.DONE
    if ctx.site == doc["creator"] and waiting and not known(holder, ctx):
        # No site of ours will ever start, run or finish it: give it back at once.
        detail = f"held by {holder!r}, which is not a known site"
        return Decision("release", release(ctx, detail), detail=detail)
    late = record_late_start(doc, step, ctx, pool)
    if late is not None:
        return late
    if (doc["_id"], doc["step"]) in pool.running and step_phase(step) < Phase.RUNNING:
        # A run of ours this revision does not show started: launched ahead and stopped,
        # or this view is behind. Its report says what it did (plan_finish, late_start);
        # starting the step again first would give two runs one epoch.
        return STAY
    match step_phase(step):
        case Phase.OPEN:
            return on_open(doc, step, ctx, pool)
        case Phase.CLAIMED:
            return on_claimed(doc, step, ctx, pool)
        case Phase.WON:
            return on_won(doc, step, ctx, pool)
        case Phase.RUNNING:
            return on_running(doc, step, ctx, pool)
        case Phase.DONE:
            # Our writes always advance past an ended step; only a foreign
            # write leaves one current. The creator ends the job rather than guess.
            if ctx.site != doc["creator"]:
                return STAY
            return Decision("fail", fail_job(ctx, "inconsistent: the current step already ended"))


IGNORE = "ignore"  # an action: nothing to do here until the document changes


def known(site: Any, ctx: Context) -> bool:
    return ctx.known_sites is None or site == ctx.site or site in ctx.known_sites


def step_holder(step: Step) -> str | None:
    """The site a claimed, won or running step waits on (None when it names none)."""
    return step.get("winner") if step_phase(step) >= Phase.WON else step.get("claimed_by")


def on_unknown_creator(doc: Job, ctx: Context) -> Decision:
    """Nobody can arbitrate a job whose creator is no known site: one site ends it.

    The first known site by name, so that exactly one site writes; the others
    leave it alone rather than book workers for claims nobody will decide.
    """
    assert ctx.known_sites is not None
    reason = f"creator {doc['creator']!r} is not a known site"
    if ctx.site != min(ctx.known_sites | {ctx.site}):
        return Decision(IGNORE, detail=reason)
    return Decision("fail", fail_job(ctx, f"{reason}: nobody can arbitrate it"), detail=reason)


def runnable_anywhere(step: Step, ctx: Context) -> bool:
    if ctx.known_sites is None:
        return True
    return any(t in (ANY, ALL) or t in ctx.known_sites for t in targets(step))


def settle_local_work(doc: Job, ctx: Context, pool: PoolView) -> Decision | None:
    """Drop bookings and executions for this job that the document no longer backs.

    Only a document that has moved past our work ends it. One that is behind it
    (an older revision delivered late by the feed, or a job that went back a step:
    a revocation outranks a branch that went on) leaves an execution running, its
    report fenced anyway, and a booking only until the booking timeout (backs_booking).
    """
    job_id = doc["_id"]
    for key, run in pool.running.items():
        if key[0] == job_id and moved_past_execution(doc, key, run.epoch, ctx.site):
            reason = "job cancelled" if doc["job_status"] == "cancelled" else "execution superseded"
            return Decision("kill", before=(Kill(key, reason),), detail=reason)
    for key, booking in pool.booked.items():
        if key[0] == job_id and not backs_booking(doc, key, booking, ctx):
            return Decision("free", before=(Unbook(key),), detail="booking no longer needed")
    return None


def behind(doc: Job, key: StepKey, epoch: int, site: str | None = None) -> bool:
    """Is this view of the job older than a step and epoch we already acted on?"""
    if doc["step"] != key[1]:
        return doc["step"] < key[1] and doc["job_status"] is None
    step = doc["job"][key[1]]
    if is_broadcast(step) and site is not None:
        return sub_run_behind(step, epoch, site)
    return step.get("epoch", 0) < epoch


def backs_execution(doc: Job, key: StepKey, epoch: int, site: str) -> bool:
    if not is_live(doc) or doc["step"] != key[1]:
        return False
    step = doc["job"][key[1]]
    if is_broadcast(step):
        return backs_sub_run(step, epoch, site)
    return step.get("epoch", 0) == epoch and step.get("winner") == site


def moved_past_execution(doc: Job, key: StepKey, epoch: int, site: str) -> bool:
    return not backs_execution(doc, key, epoch, site) and not behind(doc, key, epoch, site)


def backs_booking(doc: Job, key: StepKey, booking: Booking, ctx: Context) -> bool:
    if behind(doc, key, 0, ctx.site):
        # An old view, or the job really went back a step: a revocation at an earlier
        # step (a higher epoch) outranks the branch where we claimed. Either way the
        # claim is undecided: keep the worker no longer than for any such claim, or
        # the step the job went back to may wait for this very worker for ever.
        return booking.age < ctx.booking_timeout
    if not is_live(doc) or doc["step"] != key[1]:
        return False
    step = doc["job"][key[1]]
    if is_broadcast(step):
        return sub_run_open(step, ctx.site)
    phase = step_phase(step)
    if phase >= Phase.WON:
        # The winner has settled: keep the worker only if we won.
        return step.get("winner") == ctx.site
    # Still undecided: keep waiting for the creator, but not forever.
    return booking.age < ctx.booking_timeout


def on_open(doc: Job, step: Step, ctx: Context, pool: PoolView) -> Decision:
    key = (doc["_id"], doc["step"])
    if allows(step, ctx.site) and not willing(step, ctx):
        # Until the job changes: scans would offer it again and again.
        return Decision(IGNORE, detail="its command is not in this site's allow list")
    worker = pool.worker_for(key) if allows(step, ctx.site) else None
    if worker is not None and (ctx.site == doc["creator"] or sole_target(step) == ctx.site):
        # No other site can compete (sole target), or we are the arbiter
        # ourselves: start at once, in one revision instead of three.
        return start_decision(doc, step, ctx, worker, assign=True)
    if ctx.site == doc["creator"]:
        return assign_to_room(doc, step, ctx)
    # A worker booked for this very step: our claim was decided and its write lost
    # (a 409, the server down): claim again, the wait is over.
    if worker is None or (key not in pool.booked and holds_claims(doc, ctx, pool)):
        return STAY
    return Decision("claim", claim(ctx), before=(Book(key, worker),))


def holds_claims(doc: Job, ctx: Context, pool: PoolView) -> bool:
    """Does this site leave the creator's open step to its assignment, for now?

    It does until the step has been open, and a worker of ours free, for the delay:
    then the creator had the time to give us work and did not. (The step's age alone
    says nothing in a burst: steps wait in the creator's line while it feeds us, and
    claims on them would race its assignments, each a claim and a win more.)
    """
    creator = doc["creator"]
    if creator not in ctx.assigning:
        return False
    delay = ctx.fed_claim_delay if creator in ctx.fed_by else ctx.claim_delay
    return not open_for(doc, ctx, delay) or (pool.idle_for is not None
                                              and pool.idle_for < delay)


def assign_to_room(doc: Job, step: Step, ctx: Context) -> Decision:
    """The creator gives the step to a site it knows has room: one hop to a start.

    The same `won` revision it writes for a claim, so nothing else changes: the
    creator alone picks winners, a new epoch fences off any older claim, and a
    site that finds no worker free when it arrives releases it as usual.
    """
    if sole_target(step) not in (None, ctx.site):
        return STAY  # its one target site starts it without us: assigning would race it
    site = site_with_room(doc, step, ctx)
    if site is None:
        return STAY
    key = (doc["_id"], doc["step"])
    return Decision("assign", assign(ctx, site), before=(Assign(key, site),),
                    detail=f"winner {site} (it has room)")


def site_with_room(doc: Job, step: Step, ctx: Context) -> str | None:
    """The target site with the most room (ties spread by job), or None: a site with a
    free worker first, which starts it at once; a site's queue starts it when a worker
    frees there."""
    room = ctx.room or {}
    fits = [site for site, free in room.items()
            if free > 0 and site != ctx.site and known(site, ctx) and allows(step, site)]
    if not fits:
        return None
    return max(fits, key=lambda site: (ctx.idle.get(site, 0) > 0, room[site],
                                       spread(site, doc["_id"])))


# --- waiting: for other jobs to end, for a time ------------------------------------

def on_held(doc: Job, ctx: Context, pool: PoolView) -> Decision:
    """A job that waits (model.is_held): its creator alone decides when it may start.

    Other sites cannot know reliably how the awaited jobs ended, nor agree on
    "now": they leave it alone until the creator's `ready` event reaches them.
    The creator ends it `failed` as soon as an awaited job failed or was
    cancelled (unless `after_policy` is `always`), and releases it once every
    awaited job ended and its own clock has passed `not_before`: the `ready`
    event and the first decision about the released job, in one revision.
    """
    if ctx.site != doc["creator"]:
        return STAY
    failure = awaited_failure(doc, ctx)
    if failure is not None:
        return Decision("fail", fail_job(ctx, failure), detail=failure)
    if waits_for(doc, ctx):
        return STAY
    return released_from_wait(doc, ctx, pool)


WAITED_FOR = "waited for "  # how the reason of a job failed by a job it waited for starts


def awaited_failure(doc: Job, ctx: Context) -> str | None:
    """Why the job can never start: an awaited job that failed or was cancelled."""
    if after_policy(doc) == "always":
        return None
    for job_id in awaited(doc):
        status = ctx.ended.get(job_id)
        if status == "failed":
            return f"{WAITED_FOR}{job_id}, which failed"
        if status == "cancelled":
            return f"{WAITED_FOR}{job_id}, which was cancelled"
    return None


def waits_for(doc: Job, ctx: Context) -> list[str]:
    """What a waiting job still waits for, by its creator's knowledge and clock:
    each awaited job not seen ended, and its `not_before` time not yet reached."""
    pending = [job_id for job_id in awaited(doc) if job_id not in ctx.ended]
    not_before = doc.get("not_before")
    if not_before and seconds_between(ctx.now, not_before) > 0:
        pending.append(f"not before {not_before}")
    return pending


def released_from_wait(doc: Job, ctx: Context, pool: PoolView) -> Decision:
    """The `ready` event, with what the released job's first decision writes (a start,
    an assignment) in the same revision."""
    reasons = [f"{job_id} {ctx.ended[job_id]}" for job_id in awaited(doc)]
    if doc.get("not_before"):
        reasons.append(f"not before {doc['not_before']}")
    detail = "released from wait: " + ", ".join(reasons)

    def mark(new: Job) -> None:
        new["history"].append(event("ready", step=new["step"], site=ctx.site, at=ctx.now,
                                    detail=detail))

    ready = json_copy(doc)
    mark(ready)
    then = decide(ready, ctx, pool)
    follow = then.edit
    if follow is None or then.action == IGNORE:
        return Decision("ready", mark, detail=detail)

    def both(new: Job) -> None:
        mark(new)
        follow(new)

    return Decision(then.action, both, then.before, then.after, then.detail or detail)


# --- the order open steps are taken in ---------------------------------------

AGING_SECONDS = 10  # waiting this long is worth one priority level (docs/protocol.md)
UNSTAMPED_BAND = 2**53 - 1  # no creation time yet: after every stamped job


UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_SECOND = timedelta(seconds=1)


def claim_rank(priority: Any, created_at: Any) -> int:
    """Where a job's open step stands in line: lower goes first; the same at every site.

    rank = floor(creation second / AGING_SECONDS) - priority: a job that has
    waited k * AGING_SECONDS longer than another counts k priority levels
    higher, so a constant stream of urgent jobs delays a low one by a bounded
    time, never forever. The rank depends on the document alone, never on
    "now", so the `claimable` view (couch_design/jobdist/views/claimable/map.js,
    the same arithmetic) can sort by it. Jobs of one rank are taken in the
    `spread` order, so sites do not all claim the same one. Values a document
    written around validation may hold read as priority 0 and "not stamped".
    """
    band = UNSTAMPED_BAND
    if is_iso_utc(created_at):
        band = (parse_time(created_at) - UNIX_EPOCH) // ONE_SECOND // AGING_SECONDS
    return band - (int(priority) if is_integer(priority) else 0)  # 2.0 is 2 in JavaScript


def doc_rank(doc: Leaf) -> int:
    return claim_rank(doc.get("priority", 0), doc.get("created_at"))


def line_place(site: str, doc_id: str, rank: int, created_at: str,
               own: bool) -> tuple[int, int, str, int]:
    """Where a job's open step stands in `site`'s line (docs/protocol.md, "The line"):
    by rank; within a rank, the jobs the site created first, oldest first (it starts
    them at once, in one revision), then the others' in its `spread` order, so that
    sites do not all go for the steps the creator is starting (a claim lost, and a
    conflict, for each)."""
    if own:
        return rank, 0, created_at, 0
    return rank, 1, "", spread(site, doc_id)


def doc_place(site: str, doc_id: str, doc: Leaf) -> tuple[int, int, str, int]:
    """line_place, read from the job's document (its rank first)."""
    created = doc.get("created_at")
    return line_place(site, doc_id, doc_rank(doc), created if isinstance(created, str) else "",
                      own=doc.get("creator") == site)


def spread(site: str, doc_id: str) -> int:
    """A stable pseudo-random order of (site, job) pairs: sites do not all claim the same
    equally urgent jobs, and equal rooms do not all go to one site."""
    return int.from_bytes(hashlib.blake2b(f"{site}/{doc_id}".encode(), digest_size=4).digest())


def open_for(doc: Job, ctx: Context, delay: float) -> bool:
    """Has the step been open for `delay` seconds, by the document's own times?

    The creator had its chance to assign it. Clocks that disagree only move
    when a site falls back to claiming, never who wins.
    """
    touched = doc.get("updated_at") or doc.get("created_at")
    return not touched or seconds_between(touched, ctx.now) >= delay


def willing(step: Step, ctx: Context) -> bool:
    """Would this site take the step, given its allow-list? Another target may run
    a command we refuse; a step with us as its only target is taken, and refused
    with the reason when it runs, so that the job fails rather than waits forever."""
    if ctx.runs is None or sole_target(step) == ctx.site:
        return True
    return ctx.runs(step["do"])


def on_claimed(doc: Job, step: Step, ctx: Context, pool: PoolView) -> Decision:
    if ctx.site != doc["creator"]:
        return STAY  # only the creator picks the winner
    return Decision("assign", assign(ctx), detail=f"winner {step['claimed_by']}")


def on_won(doc: Job, step: Step, ctx: Context, pool: PoolView) -> Decision:
    if step["winner"] != ctx.site:
        return revoke_if_expired(doc, step, ctx)
    key = (doc["_id"], doc["step"])
    if win_lapsed(step, ctx):
        booked = (Unbook(key),) if key in pool.booked else ()
        return Decision("release", release(ctx, WIN_LAPSED), before=booked, detail=WIN_LAPSED)
    worker = pool.worker_for(key)
    if worker is not None:
        return start_decision(doc, step, ctx, worker, assign=False)
    taken = pool.oldest_undecided()
    if taken is None and queues(doc, key, pool, ctx):
        return Decision(QUEUED, before=(Queue(key),), detail="won; waits for a worker here")
    if taken is None:
        return Decision("release", release(ctx, no_worker_reason(doc, key, pool, ctx)))
    # A decided win beats an undecided claim: without this, a site whose claims
    # outlive its bookings wins steps it can never start, and releases them forever.
    other, worker = taken
    decision = start_decision(doc, step, ctx, worker, assign=False)
    return Decision(decision.action, decision.edit, (Unbook(other), *decision.before),
                    decision.after,
                    f"{WON_CLAIM}; worker taken from the claim on {other[0]} step {other[1]}")


WIN_LAPSED = "won, but its start-by lease had passed when the win reached us"


def win_lapsed(step: Step, ctx: Context) -> bool:
    """Has our win's start-by lease passed, by our clock? Then it is released, never
    started: the creator may be revoking it at this very moment (revoke_if_expired),
    and a start written concurrently with that revocation would run the step in an
    epoch the merge overturns, and anything chained onto its end with it. Started
    before its deadline, a start has the skew margin to reach the creator first."""
    deadline = step.get("lease_until")
    return deadline is not None and seconds_between(deadline, ctx.now) >= 0


def start_lapsed(step: Step, ctx: Context) -> bool:
    """Is the step a win of ours not started, its start-by lease passed? Then no start
    of it is written, not even late with a run launched ahead (win_lapsed)."""
    return step_phase(step) == Phase.WON and win_lapsed(step, ctx)


QUEUED = "queue"  # an action: a win held here until a worker frees (no write)
# Why a winner gives a step back unstarted: the creator stops queueing steps at a
# site that says so, for a while (status.Board.saw_job).
NO_WORKER = "won but no worker is free"  # and holds no wins (a daemon before queues did not)
NO_WORKER_IN_TIME = "won, but no worker freed within half the start-by lease"
QUEUE_FULL = "won but no worker is free, and the queue is full"


def no_worker_reason(doc: Job, key: StepKey, pool: PoolView, ctx: Context) -> str:
    if held_too_long(doc, key, pool, ctx):
        return NO_WORKER_IN_TIME
    return QUEUE_FULL if pool.queue_limit else NO_WORKER


def queues(doc: Job, key: StepKey, pool: PoolView, ctx: Context) -> bool:
    """Does this site hold a win no worker is free for, rather than release it?

    Held, it starts on the next worker that frees, with no replication hop:
    released, it goes back to the creator and comes back by a claim and a win.
    At most `pool.queue_limit` are held, none for half its start-by lease or
    more (held_too_long): the creator revokes only a lease silent for the whole
    lease and the skew margin, so the start, or the release, reaches it first.
    """
    held_elsewhere = sum(1 for other in pool.queued if other != key)
    return held_elsewhere < pool.queue_limit and not held_too_long(doc, key, pool, ctx)


def held_too_long(doc: Job, key: StepKey, pool: PoolView, ctx: Context) -> bool:
    """Is half the win's start-by lease gone, by our own count of how long we hold it, or
    by the win's own times (its `won` event and its `lease_until`, both the creator's
    clock, against ours)? Our count restarts with the daemon; the win's times do not,
    as far as the clocks agree."""
    if pool.queued.get(key, 0.0) >= ctx.lease / 2:
        return True
    step = _current(doc)
    won_at = next((entry.get("at") for entry in reversed(doc["history"])
                   if entry.get("event") == "won" and entry.get("step") == key[1]
                   and entry.get("epoch", 0) == step.get("epoch", 0)), None)
    deadline = step.get("lease_until")
    if not won_at or not deadline:
        return False  # (its `won` event shed from a full history: our own count alone)
    return seconds_between(won_at, ctx.now) >= seconds_between(won_at, deadline) / 2


def on_running(doc: Job, step: Step, ctx: Context, pool: PoolView) -> Decision:
    key = (doc["_id"], doc["step"])
    winner = step.get("winner")  # a foreign write may have left it out
    if winner == ctx.site and key not in pool.running:
        # Our promise with no worker behind it: the site restarted mid-step.
        return Decision("release", release(ctx, "worker lost (site restarted)"))
    if winner != ctx.site:
        return revoke_if_expired(doc, step, ctx)
    return STAY


def revoke_if_expired(doc: Job, step: Step, ctx: Context) -> Decision:
    """The creator takes back a step whose winner stopped renewing its lease.

    The new epoch fences the old execution off: if the winner was only slow or
    cut off, it kills the step once it sees the epoch, and its report is stale.
    """
    if ctx.site != doc["creator"] or not ctx.lease_expired(step):
        return STAY
    winner = step.get("winner")
    detail = f"lease of {winner} expired at {step['lease_until']}"
    silent = (Revoke((doc["_id"], doc["step"]), winner),) if isinstance(winner, str) else ()
    return Decision("revoke", release(ctx, detail), before=silent, detail=detail)


def start_decision(doc: Job, step: Step, ctx: Context, worker: str, *, assign: bool,
                   chained_on: int | None = None) -> Decision:
    """Start the step on `worker`; launched ahead of its write unless it is a win near
    its start-by deadline (fresh_win). A start chained onto an end is launched ahead
    too: if the end's write is lost, the end is held and the run goes on, its start
    written with the held end (chain_next, PlanRunner.riding)."""
    key = (doc["_id"], doc["step"])
    epoch = step.get("epoch", 0) + (1 if assign else 0)
    ahead = assign or fresh_win(step, ctx)
    return Decision(
        "start",
        start(ctx, worker, assign=assign),
        before=(Book(key, worker),),
        after=(Launch(key, epoch, worker, ahead=ahead, chained_on=chained_on),),
        detail="" if assign else WON_CLAIM,
    )


# --- a start launched ahead of its write ----------------------------------------

# The manager launches a step as soon as it has planned its start, and writes the
# start meanwhile (docs/protocol.md, "Launch ahead"). If that write is lost (a 409:
# a newer revision came in between; the server did not answer), the start is
# written on the revision that came in between, when that one still lets it be.
LATE_START = "launched ahead; its start written late"
START_LAPSED = "its start was not written before the win's start-by lease passed"


def late_start(doc: Job, key: StepKey, epoch: int, ctx: Context,
               after: str | None = None) -> bool:
    """Does the document still call for the start of an execution (key, epoch) this
    site launched ahead of its start, whose start is not written?

    So it does when the start is still the one start_decision writes: in a win of
    ours of that very epoch; or, for an open or merely claimed step of which we are
    the creator or the only target, in the next epoch (the creator alone picks
    winners, and a claim does not move the epoch). And only after the run of the step
    before that the launch followed (`after`, when known: follows): a revocation of
    that run, merged in meanwhile, opens the step again in the same epoch, after a
    run of the step before that ended later than ours began.
    """
    if doc["_id"] != key[0] or not is_live(doc) or doc["step"] != key[1]:
        return False
    if after is not None and follows(doc, key[1]) != after:
        return False
    step = _current(doc)
    if is_broadcast(step):
        return False  # (its sub-runs are never launched ahead: start_sub_run_decision)
    phase = step_phase(step)
    if phase == Phase.WON:
        return step.get("winner") == ctx.site and step.get("epoch", 0) == epoch
    ours = ctx.site == doc["creator"] or sole_target(step) == ctx.site
    return phase < Phase.WON and ours and step.get("epoch", 0) + 1 == epoch


def follows(doc: Job, index: int) -> str | None:
    """Which run of the step before step `index` a start of it follows: that step's
    end, as its finish time (None for the first step)."""
    if index == 0 or index > len(doc["job"]):
        return None
    finish = doc["job"][index - 1].get("finish_time")
    return str(finish) if finish is not None else None


def fresh_win(step: Step, ctx: Context) -> bool:
    """Has our win at least half its start-by lease left, by our clock? Only then is it
    launched ahead: the creator revokes a win only past its lease (and the skew margin),
    so a newer revision that revoked it cannot be waiting unseen in our database."""
    deadline = step.get("lease_until")
    return deadline is not None and seconds_between(ctx.now, deadline) >= ctx.lease / 2


def record_late_start(doc: Job, step: Step, ctx: Context, pool: PoolView) -> Decision | None:
    """The start of a step launched here ahead of it, whose write was lost (late_start),
    with no worker to book and nothing to launch; None when there is none."""
    key = (doc["_id"], doc["step"])
    running = pool.ahead.get(key)
    if running is None or not late_start(doc, key, running.epoch, ctx, running.after):
        return None
    if start_lapsed(step, ctx):
        return None  # the run is stopped
    return Decision("start", late_start_edit(step, ctx, running.worker, running.launched_at),
                    detail=LATE_START)


def late_start_edit(step: Step, ctx: Context, worker: str, launched_at: str | None) -> Edit:
    """The start late_start calls for: in the win's epoch, or ours in the next; its time
    the launch's, where known (its lease runs from now)."""
    return start(ctx, worker, assign=step_phase(step) < Phase.WON, at=launched_at)


def records_start(doc: Job | None, key: StepKey, epoch: int, site: str) -> bool:
    """Does this revision show the execution (key, epoch) started at `site`?"""
    return doc is not None and doc["_id"] == key[0] and backs_execution(doc, key, epoch, site) \
        and step_phase(doc["job"][key[1]]) == Phase.RUNNING


def after_edit(first: Edit, then: Decision) -> Decision:
    """`then`, its revision written on top of `first`'s edit."""
    second = then.edit

    def both(doc: Job) -> None:
        first(doc)
        if second is not None:
            second(doc)

    return dataclasses.replace(then, edit=both)


# --- edits: how each decision changes the document ----------------------------

def _current(doc: Job) -> Step:
    return doc["job"][doc["step"]]


def _log(doc: Job, name: str, ctx: Context, *, worker: str | None = None,
         detail: str | None = None, at: str | None = None) -> None:
    """A history event about the current step (call before the step index moves), `at`
    now unless given."""
    index = doc["step"]
    doc.setdefault("history", []).append(
        event(name, step=index, site=ctx.site, at=at or ctx.now, worker=worker,
              epoch=doc["job"][index].get("epoch", 0), detail=detail)
    )


def claim(ctx: Context) -> Edit:
    def edit(doc: Job) -> None:
        _current(doc)["claimed_by"] = ctx.site
        _log(doc, "claimed", ctx)
    return edit


def assign(ctx: Context, site: str | None = None) -> Edit:
    """The step's winner: its claimer, or `site`, which the creator chose for its room."""
    def edit(doc: Job) -> None:
        step = _current(doc)
        if site is not None:
            step["claimed_by"] = site
        step["winner"] = step["claimed_by"]
        step["epoch"] = step.get("epoch", 0) + 1
        step["lease_until"] = later(ctx.now, ctx.lease)  # start by then, or be revoked
        detail = f"winner {step['winner']}" + (" (it has room)" if site is not None else "")
        _log(doc, "won", ctx, detail=detail)
    return edit


def start(ctx: Context, worker: str, *, assign: bool, at: str | None = None) -> Edit:
    """The start of an execution now, or launched `at` (a start written late)."""
    def edit(doc: Job) -> None:
        step = _current(doc)
        if assign:
            step["claimed_by"] = step["winner"] = ctx.site
            step["epoch"] = step.get("epoch", 0) + 1
        step["step_status"] = "running"
        step["executioner"] = worker
        step["start_time"] = at or ctx.now
        step["lease_until"] = later(ctx.now, ctx.lease)
        step["progress"] = None  # a new execution has reported nothing yet
        _log(doc, "started", ctx, worker=worker, at=at)
    return edit


def release(ctx: Context, reason: str) -> Edit:
    """Give the step back: a new epoch fences off whatever ran in the old one."""
    def edit(doc: Job) -> None:
        step = _current(doc)
        step.update({"claimed_by": None, "winner": None, "executioner": None,
                     "step_status": None, "start_time": None, "lease_until": None,
                     "progress": None})
        step["epoch"] = step.get("epoch", 0) + 1
        _log(doc, "released", ctx, detail=reason)
    return edit


def fail_job(ctx: Context, reason: str) -> Edit:
    def edit(doc: Job) -> None:
        _current(doc)["step_status"] = "failed"
        doc["job_status"] = "failed"
        _log(doc, "failed", ctx, detail=reason)
    return edit


def plan_refused(leaves: Sequence[Leaf], ctx: Context, reason: str) -> Plan:
    """The server refused the revision we meant to write: the creator ends the job.

    A refusal is for good (a count past its bound, no room left under the size
    limit): retrying the same write cannot help. Only the creator writes, as
    for any failure it decides; if even that is refused, the job is left alone.
    """
    if not leaves:
        return NOTHING
    merged = merge(leaves)
    if ctx.site != merged["creator"] or not is_live(merged):
        return NOTHING
    detail = f"the server refused the next revision: {reason}"[:MAX_DETAIL]
    return finalize(leaves, merged, Decision("fail", fail_job(ctx, detail), detail=detail), ctx)


# --- staying under the size limit ------------------------------------------------

MAX_DETAIL = 1000  # characters of an event's detail we write, or keep when short of room
BOOKKEEPING_EVENTS = ("claimed", "won", "released", "retried", "stale_finish")


def fit(doc: Job, keep_events_from: int, limit: int = MAX_DOC_SIZE) -> None:
    """Shed what matters least until the revision fits under the server's size limit.

    Outputs and history grow with every step; past the limit every write is
    refused and the job could never end. In order, until it fits: the outputs
    of all but the newest step that has one (oldest first), bookkeeping events
    (oldest first), long event details, the newest output. Events from
    `keep_events_from` on are this revision's own, and stay: a write that only
    fits without its own event (a claim on a full document) is better refused.
    The size is kept up to date piece by piece: measuring 1 MiB takes milliseconds.
    A revision far below the limit, nearly every one, is measured no further than its
    Python text (json_size_over): respelling its numbers as JavaScript would was a
    third of this check on every decision.
    """
    if not json_size_over(doc, limit):
        return
    size = json_size(doc)
    for shed in (shed_old_outputs, shed_bookkeeping, shed_long_details, shed_all_outputs):
        if size <= limit:
            return
        size = shed(doc, size, limit, keep_events_from)


def shed_old_outputs(doc: Job, size: int, limit: int, _: int) -> int:
    return shed_outputs(with_output(doc)[:-1], size, limit)


def shed_all_outputs(doc: Job, size: int, limit: int, _: int) -> int:
    return shed_outputs(with_output(doc), size, limit)


def with_output(doc: Job) -> list[RunRecord]:
    """The records holding an output, oldest step first: steps, and broadcast sub-runs."""
    records = [record for step in doc["job"] for record in (step, *sub_runs(step).values())]
    return [record for record in records if record.get("output") is not None]


def shed_outputs(steps: list[RunRecord], size: int, limit: int) -> int:
    for step in steps:
        if size <= limit:
            break
        size -= json_length(step["output"]) - json_length(None)
        step["output"] = None
    return size


def shed_bookkeeping(doc: Job, size: int, limit: int, keep_from: int) -> int:
    kept = []
    for index, entry in enumerate(doc["history"]):
        if size > limit and index < keep_from and entry["event"] in BOOKKEEPING_EVENTS:
            size -= json_length(entry) + 1  # and its comma
        else:
            kept.append(entry)
    doc["history"] = kept
    return size


def shed_long_details(doc: Job, size: int, limit: int, keep_from: int) -> int:
    for entry in doc["history"][:keep_from]:
        detail = entry.get("detail")
        if size > limit and isinstance(detail, str) and len(detail) > MAX_DETAIL:
            shorter = detail[:MAX_DETAIL] + "..."
            size += json_length(shorter) - json_length(detail)
            entry["detail"] = shorter
    return size


# --- finishing an execution ---------------------------------------------------

def plan_finish(
    leaves: Sequence[Leaf],
    ctx: Context,
    pool: PoolView,
    key: StepKey,
    epoch: int,
    worker: str,
    outcome: StepOutcome,
    *,
    chained: bool = False,
    after: str | None = None,
) -> Plan:
    """Record what an execution did; only a current execution advances the job.

    `pool` must already show the execution's worker as free. When the step
    succeeded and this site may run the next one, it starts it in the same
    revision: nobody else writes to a running step, so nobody can compete.
    An execution launched ahead of its start whose start was never written
    (late_start) gets its start and its end in one revision, unless it was
    `chained` onto an end: only that end's record may start it (chain_next);
    one that did not ran on an end that no longer counts (a stale finish). `after`:
    the end of the step before that its launch followed (late_start).
    """
    merged = merge(leaves)
    if chained or not late_start(merged, key, epoch, ctx, after):
        return finalize(leaves, merged, finish_decision(merged, ctx, pool, key, epoch, worker,
                                                        outcome), ctx)
    step = _current(merged)
    begin = late_start_edit(step, ctx, worker, outcome.start_time)
    if start_lapsed(step, ctx):
        # The creator may be revoking the win: recorded as run and given back, never a
        # finish a next step could be chained onto (win_lapsed).
        detail = f"{START_LAPSED}: {outcome.reason}"
        return finalize(leaves, merged, after_edit(begin, Decision(
            "release", release(ctx, detail), detail=detail)), ctx)
    started = json_copy(merged)
    begin(started)
    then = finish_decision(started, ctx, pool, key, epoch, worker, outcome)
    return finalize(leaves, merged, after_edit(begin, then), ctx)


def finish_decision(merged: Job, ctx: Context, pool: PoolView, key: StepKey, epoch: int,
                    worker: str, outcome: StepOutcome) -> Decision:
    if not backs_execution(merged, key, epoch, ctx.site):
        if outcome.cancelled and merged["job_status"] == "cancelled":
            return Decision("cancelled", record_cancelled(merged, ctx, key, worker, epoch,
                                                          outcome))
        detail = f"epoch {epoch} is no longer current: {outcome.reason}"
        noted = note(ctx, "stale_finish", key, worker, epoch, detail)
        if not burns_epoch(merged, key, epoch):
            return Decision("stale_finish", noted)

        def burned(doc: Job) -> None:
            noted(doc)
            doc["job"][key[1]]["epoch"] = epoch
        return Decision("stale_finish", burned)
    if outcome.cancelled:
        stopped = f"stopped on this site: {outcome.reason}"
        return Decision("release", release_sub_run(ctx, ctx.site, stopped)
                        if is_broadcast(_current(merged)) else release(ctx, stopped))
    if is_broadcast(_current(merged)):
        return finish_sub_run(merged, ctx, pool, worker, outcome)
    decision = Decision("finish", record_outcome(ctx, worker, outcome), detail=outcome.reason)
    if outcome.ok:
        decision = chain_next(merged, decision, ctx, pool)
    return decision


def burns_epoch(merged: Job, key: StepKey, epoch: int) -> bool:
    """Is this a run of ours that no revision showed started (launched ahead, its start
    never written: a chained run whose end turned out stale), of a step that is still
    to start in an earlier epoch? Then its stale finish moves that step's epoch up to
    the run's, so no later start here issues the same fencing token again."""
    if not is_live(merged) or not merged["step"] <= key[1] < len(merged["job"]):
        return False
    step = merged["job"][key[1]]
    to_start = key[1] > merged["step"] or step_phase(step) < Phase.WON
    return to_start and not is_broadcast(step) and step.get("epoch", 0) < epoch


def note(ctx: Context, name: str, key: StepKey, worker: str, epoch: int, detail: str) -> Edit:
    def edit(doc: Job) -> None:
        doc.setdefault("history", []).append(
            event(name, step=key[1], site=ctx.site, at=ctx.now, worker=worker,
                  epoch=epoch, detail=detail)
        )
    return edit


def end_step(step: Step, outcome: StepOutcome) -> None:
    """What an execution did, on its step."""
    step["step_status"] = ended(outcome)
    record_end(step, outcome)


def end_sub_run(run: SubRun, outcome: StepOutcome) -> None:
    """What an execution did, on its broadcast sub-run."""
    run["status"] = ended(outcome)
    record_end(run, outcome)


def ended(outcome: StepOutcome) -> RunStatus:
    return "finished" if outcome.ok else "failed"


def record_end(record: RunRecord, outcome: StepOutcome) -> None:
    """The fields an execution's end sets, on its step or its sub-run alike."""
    record.update({
        "exec_time": round(outcome.exec_time, 6),
        "start_time": outcome.start_time,
        "finish_time": outcome.finish_time,
        "attempts": outcome.attempts,
        "exit_code": outcome.exit_code,
        "lease_until": None,
        "output": {"stdout": outcome.stdout, "stderr": outcome.stderr},
    })
    if outcome.progress is not None:  # the last report, even one no heartbeat carried yet
        record["progress"] = copy.copy(outcome.progress)


def record_cancelled(merged: Job, ctx: Context, key: StepKey, worker: str, epoch: int,
                     outcome: StepOutcome) -> Edit:
    """The run a cancellation killed: the step says it ended (failed, killed), so the
    document does not show it running for ever; a stale run only leaves its event."""
    live: Job = {**merged, "job_status": None}
    current = backs_execution(live, key, epoch, ctx.site)
    recorded = note(ctx, "cancelled", key, worker, epoch, "killed: job cancelled")

    def edit(doc: Job) -> None:
        if current and is_broadcast(doc["job"][key[1]]):
            end_sub_run(sub_runs(doc["job"][key[1]])[ctx.site], outcome)
        elif current:
            end_step(doc["job"][key[1]], outcome)
        recorded(doc)
    return edit


def record_outcome(ctx: Context, worker: str, outcome: StepOutcome) -> Edit:
    def edit(doc: Job) -> None:
        end_step(_current(doc), outcome)
        _log(doc, "finished" if outcome.ok else "failed", ctx, worker=worker,
             detail=outcome.reason)
        end_current_step(doc, outcome.ok)
    return edit


def end_current_step(doc: Job, ok: bool) -> None:
    """The job moves to its next step (or succeeds), or fails."""
    if not ok:
        doc["job_status"] = "failed"
        return
    doc["step"] += 1
    if doc["step"] == len(doc["job"]):
        doc["job_status"] = "success"


def chain_next(merged: Job, decision: Decision, ctx: Context, pool: PoolView) -> Decision:
    """Finish, and start the next step here in the same write when we may."""
    after_finish = json_copy(merged)
    assert decision.edit is not None
    decision.edit(after_finish)
    if not is_live(after_finish):
        return decision
    step = _current(after_finish)
    if is_broadcast(step):  # its creator opens it: it names the sites (open_broadcast)
        if ctx.site != after_finish["creator"]:
            return decision
        return in_turn(decision, open_broadcast(after_finish, step, ctx, pool))
    key = (after_finish["_id"], after_finish["step"])
    ending = _current(merged).get("epoch", 0)
    rider = pool.riding.get(key)
    if rider is not None and (rider.epoch, rider.end_epoch) == (step.get("epoch", 0) + 1, ending) \
            and allows(step, ctx.site):
        # Our run of it, chained onto an earlier write of this very end that was lost
        # (a 409, or the server down: the end was held): its start is this one.
        return in_turn(decision, start_decision(after_finish, step, ctx, rider.worker,
                                                assign=True, chained_on=ending))
    worker = pool.worker_for(key)
    if worker is None or not (allows(step, ctx.site) and willing(step, ctx)) \
            or key in pool.running:
        # (A run of that step still here is a stale one, chained onto a finish
        # that was revoked: it is killed first, once the document shows why.)
        return decision
    return in_turn(decision, start_decision(after_finish, step, ctx, worker, assign=True,
                                            chained_on=ending))


def in_turn(decision: Decision, follow: Decision) -> Decision:
    """`decision`, then `follow` decided on its result, in one revision."""
    first, second = decision.edit, follow.edit
    if second is None:
        return decision
    assert first is not None

    def both(doc: Job) -> None:
        first(doc)
        second(doc)

    return Decision(decision.action, both, (*decision.before, *follow.before),
                    (*decision.after, *follow.after), decision.detail)


# --- keep-alive -----------------------------------------------------------------

def keepalive(leaves: list[Doc], ctx: Context, stale_after: float) -> Job | None:
    """The re-save that makes other sites look at a forgotten job again, if due.

    Only the creator re-saves, only a live job whose current step nobody has
    claimed, only when nothing changed for `stale_after` seconds, and only on an
    unconflicted document; it changes nothing but `keepalive_at`.
    """
    if len(leaves) != 1 or validate_job(leaves[0]):
        return None
    doc = normalise(leaves[0])
    if doc["creator"] != ctx.site or not is_live(doc) or not is_accepted(doc):
        return None  # (the manager accepts a job its creator has not yet accepted)
    if step_phase(doc["job"][doc["step"]]) != Phase.OPEN or is_held(doc):
        return None  # (a waiting job is for no site to take: nothing to remind them of)
    # (An accepted job has its creation time: `or ""` only tells mypy so.)
    last = max(doc["updated_at"] or doc["created_at"] or "", doc.get("keepalive_at") or "")
    if (parse_time(ctx.now) - parse_time(last)).total_seconds() < stale_after:
        return None
    touched = json_copy(doc)
    touched["keepalive_at"] = ctx.now
    return touched


UNKNOWN_ROOM = 10  # re-saves a keep-alive pass makes for a site with no fresh status


def resave_picks(stale: Sequence[tuple[str, Any]], room: Mapping[str, int | None]) -> list[str]:
    """Which stale open jobs a keep-alive pass re-saves: `stale` holds (job id, its
    current step's target) in line order, `room` the free workers of every known site as
    this creator last knew them (its own; the others' from their statuses; None: not
    known, taken as UNKNOWN_ROOM). A job is re-saved for a site its step allows that has
    a free worker left, the one with the most.

    A re-save reminds the sites of a job: a site with a free worker that missed it
    claims it, or, if we are that site, starts it. Beyond those, it reminds nobody able
    to act and costs every site a revision: under a backlog longer than `stale_after`
    the whole line was re-saved every pass (docs/performance.md). A job left out waits
    in line: the creator starts or assigns it as workers free, and every site's scans
    find open steps the feed did not show.
    """
    left = {site: UNKNOWN_ROOM if free is None else free for site, free in room.items()}
    picks = []
    for job_id, target in stale:
        wanted = target if isinstance(target, list) else [target]
        if not wanted or not all(isinstance(site, str) for site in wanted):
            continue  # malformed: core.keepalive would refuse it anyway
        fits = [site for site, free in left.items() if free > 0
                and allows({"target": wanted}, site)]
        if fits:
            site = max(fits, key=lambda name: left[name])
            left[site] -= 1
            picks.append(job_id)
    return picks


def start_recorded(step: Step) -> bool:
    """Does the step show its execution started? (A broadcast step's parts each say so
    for their site: backs_execution looks there.)"""
    return is_broadcast(step) or step_phase(step) == Phase.RUNNING


def plan_renew(leaves: Sequence[Leaf], ctx: Context, key: StepKey, epoch: int,
               renew_below: float | None = None, report: Progress | None = None) -> Plan:
    """The heartbeat: push the lease of our current execution forward, and record
    the execution's latest progress `report` in the same revision.

    With `renew_below`, only a lease with less than that many seconds left is
    renewed: a step that started a moment ago needs no write yet, unless it
    has new progress to show. Fenced like a finish: a run whose epoch is not
    the step's current one writes neither.
    """
    merged = merge(leaves)
    if not backs_execution(merged, key, epoch, ctx.site):
        return NOTHING
    if not start_recorded(_current(merged)):
        return NOTHING  # a win whose start is not written: no lease but the start's own
    step = execution_record(merged, ctx.site)
    news = report is not None and report != step.get("progress")
    deadline = step.get("lease_until")
    if not news and renew_below is not None and deadline \
            and seconds_between(ctx.now, deadline) > renew_below:
        return NOTHING

    def edit(doc: Job) -> None:
        execution_record(doc, ctx.site)["lease_until"] = later(ctx.now, ctx.lease)
        if news and report is not None:  # (news has a report)
            execution_record(doc, ctx.site)["progress"] = copy.copy(report)

    return finalize(leaves, merged, Decision("renew", edit), ctx)


def plan_event(leaves: Sequence[Leaf], ctx: Context, key: StepKey, epoch: int, worker: str,
               name: str, detail: str, ahead: Running | None = None) -> Plan:
    """Append a history event for a running execution, if it is still the current one.
    An execution launched ahead (`ahead`: when, and after what) whose start is not
    written yet gets its start in the same revision, where late_start still calls
    for it."""
    merged = merge(leaves)
    if not is_live(merged):
        return NOTHING
    noted = Decision(name, note(ctx, name, key, worker, epoch, detail))
    step = _current(merged)
    if backs_execution(merged, key, epoch, ctx.site) and start_recorded(step):
        return finalize(leaves, merged, noted, ctx)
    if ahead is None or ahead.launched_at is None \
            or not late_start(merged, key, epoch, ctx, ahead.after) or start_lapsed(step, ctx):
        return NOTHING
    begin = late_start_edit(step, ctx, worker, ahead.launched_at)
    return finalize(leaves, merged, after_edit(begin, noted), ctx)


def plan_adopt(leaves: Sequence[Leaf], ctx: Context, gone: str, reason: str) -> Plan:
    """An operator makes this site the creator of a live job whose creator `gone` is
    gone for good (`jobdist adopt`): see `adopt`.

    Also of a job that ended while its winning revision still shows it live
    (shown_live_after_end): `gone` died before it cleaned the conflict, and only
    a creator cleans. The adopter writes the merge on the winner and deletes the
    other leaves, as `gone` would have; nothing runs.
    """
    if not leaves:
        return NOTHING
    merged = merge(leaves)
    if merged["creator"] != gone or gone == ctx.site:
        return NOTHING
    if is_live(merged):
        return finalize(leaves, merged, adopt(merged, ctx, reason), ctx)
    if not shown_live_after_end(leaves, merged):
        return NOTHING
    decision = adopt(merged, ctx, f"{reason} ({SHOWN_LIVE})")
    return finalize(leaves, {**merged, "creator": ctx.site}, decision, ctx)


def adopt(doc: Job, ctx: Context, reason: str) -> Decision:
    """This site becomes the job's creator: from then on it arbitrates its claims,
    revokes expired leases and keeps it alive.

    Nothing else changes: a claim waiting for a decision is decided by the new
    creator, a running step keeps its lease. The `adopted` event carries the
    adoption's term in its epoch field; the merge takes the creator of the
    highest term, so a late write of the old creator cannot take the job back.
    If the old creator is in fact alive behind a partition, both sites arbitrate
    until it sees the adoption: a step may then run twice, in two epochs, recorded.
    """
    gone = doc["creator"]
    next_term = 1 + term(doc)
    detail = f"creator {gone} -> {ctx.site}: {reason}"

    def edit(new: Job) -> None:
        new["creator"] = ctx.site
        new["history"].append(event("adopted", step=new["step"], site=ctx.site, at=ctx.now,
                                    worker=None, epoch=next_term, detail=detail))

    return Decision("adopt", edit, detail=detail)


def silence(doc: Job, ctx: Context) -> str:
    """Why the job's creator is taken to be gone (an adoption's reason)."""
    return f"no status from {doc['creator']} for {ctx.creator_timeout:g} s"


def origin(doc: Job) -> str:
    """The site that created the job: its `created` event's, else (an HTTP job not yet
    accepted) its creator."""
    return next((entry["site"] for entry in doc["history"] if entry["event"] == "created"),
                doc["creator"])


def succeeds(doc: Job, ctx: Context) -> bool:
    """Is it this site's turn to take the job over from its silent creator?

    The job's line is its origin and then the origin's successors, in order. When
    the current creator (the origin, or a site that took over before) is silent,
    the first site of the line that is not silent takes over: the next successor
    when the one before went silent too, the origin itself when it is back and the
    site that took over from it is silent. A creator outside its job's line is
    left alone (an operator chose it), and so is a job its creator has not accepted
    yet: its acceptance stamps the creation time that fixes the job's identity, and
    a successor accepting it too, while the creator did on a branch not seen yet,
    would make two jobs of it (see accepting).
    """
    creator = doc["creator"]
    if creator == ctx.site or creator not in ctx.silent or not is_accepted(doc):
        return False
    if ctx.unchanged_for is not None and ctx.unchanged_for < ctx.creator_timeout:
        return False
    first = origin(doc)
    line = (first, *ctx.successors.get(first, ()))
    if creator not in line:
        return False
    return next((site for site in line if site != creator and site not in ctx.silent),
                None) == ctx.site


def plan_cancel(leaves: Sequence[Leaf], ctx: Context, reason: str) -> Plan:
    """An operator cancels a job: any site may write it; the merge keeps it (see merge).

    The site running the current step sees the cancellation on its feed and
    kills the step's process group (settle_local_work).
    """
    if not leaves:
        return NOTHING
    merged = merge(leaves)
    if merged["job_status"] is not None:
        return NOTHING

    def edit(doc: Job) -> None:
        doc["job_status"] = "cancelled"
        if is_live({**doc, "job_status": None}):
            _log(doc, "cancelled", ctx, detail=reason)

    return finalize(leaves, merged, Decision("cancel", edit, detail=reason), ctx)


# --- broadcast steps: one sub-run at each site (docs/protocol.md, "Broadcast steps") ---
#
# Who writes what: the creator opens the step (names its sites), revokes expired
# sub-run leases, records an operator's drop and ends the step; each site starts,
# renews, finishes or releases its own sub-run and no other. So no two sites ever
# compete for one sub-run, and the step's own phase has a single writer.

RUN_PHASE = {None: 0, "running": 1, "finished": 2, "failed": 2}


def sub_run_rank(run: SubRun) -> tuple[int, int, str, str, str]:
    """A site's furthest sub-run among the leaves: epoch, then phase; then, for one
    execution, its newest lease and progress; then its content, so that any two leaves
    order alike whatever order they come in."""
    report = run.get("progress")
    progress_at = str(report.get("at") or "") if report else ""
    return (run.get("epoch", 0), RUN_PHASE.get(run.get("status"), 0),
            run.get("lease_until") or "", progress_at, json.dumps(run, sort_keys=True))


def merge_sub_runs(merged: Job, leaves: list[Job]) -> None:
    """Combine the current broadcast step's sub-runs from every leaf, site by site.

    Each site's sub-run is written by that site (start, renew, finish, release) and by
    the creator (revoke), concurrently with the other sites' on other branches: the
    merge takes, per site, the furthest sub-run any leaf holds, so no site's progress
    is lost to another's write. The sites are those of the merged leaf (the creator
    opened the step, once); a drop, like a cancellation, survives any concurrent write.
    """
    if not is_live(merged):
        return
    index = merged["step"]
    step = merged["job"][index]
    runs = step.get("runs")
    if not is_broadcast(step) or runs is None:
        return
    peers = [leaf["job"][index] for leaf in leaves
             if leaf["step"] == index and isinstance(leaf["job"][index].get("runs"), dict)]
    peer_runs = [sub_runs(peer) for peer in peers]  # each peer's `runs` itself
    for site in runs:
        runs[site] = json_copy(max(
            (other[site] for other in peer_runs if site in other), key=sub_run_rank))
    dropped = {site for peer in peers for site in dropped_sites(peer)}
    if dropped:
        step["dropped"] = sorted(dropped & set(runs))


def execution_record(doc: Job, site: str) -> RunRecord:
    """Where the current step's execution at `site` is recorded: its sub-run, or the step."""
    step = _current(doc)
    return sub_runs(step)[site] if is_broadcast(step) else step


def backs_sub_run(step: Step, epoch: int, site: str) -> bool:
    """Fencing for a sub-run: the token is (epoch, site), and only a running sub-run of a
    site still in the step's set counts."""
    run = sub_runs(step).get(site)
    return run is not None and site not in dropped_sites(step) \
        and run.get("status") == "running" and run.get("epoch", 0) == epoch


def sub_run_behind(step: Step, epoch: int, site: str) -> bool:
    """An old view of a sub-run we ran: the step not opened yet, or an older epoch."""
    if step.get("runs") is None:
        return True
    run = sub_runs(step).get(site)
    return run is not None and run.get("epoch", 0) < epoch


def sub_run_open(step: Step, site: str) -> bool:
    """Is `site`'s sub-run waiting for it to start?"""
    run = counting_runs(step).get(site)
    return run is not None and run.get("status") is None


def current_leases(doc: Job) -> list[str]:
    """The lease deadlines of a live job's current step: the step's, or its sub-runs'."""
    if not is_live(doc):
        return []
    step = doc["job"][doc["step"]]
    records = [step, *sub_runs(step).values()]
    return [lease for record in records if (lease := record.get("lease_until"))]


def on_broadcast(doc: Job, step: Step, ctx: Context, pool: PoolView) -> Decision:
    if step.get("runs") is None:
        return open_broadcast(doc, step, ctx, pool) if ctx.site == doc["creator"] else STAY
    own = on_own_sub_run(doc, step, ctx, pool)
    if own != STAY or ctx.site != doc["creator"]:
        return own
    return arbitrate_broadcast(doc, step, ctx, pool)


def broadcast_sites(step: Step, ctx: Context) -> tuple[list[str], list[str]]:
    """The sites a broadcast step runs at, and the listed ones left out (unknown here).

    `all` is every site this creator knows now, when it opens the step: a site added
    to the configs later joins the broadcasts opened after it, and a job that waited
    for its turn runs where the sites are then, not where they were at submission.
    """
    known = (ctx.known_sites or frozenset()) | {ctx.site}
    if step["target"] == ALL:
        return sorted(known), []
    wanted = targets(step)
    return ([site for site in wanted if known_site(site, ctx)],
            [site for site in wanted if not known_site(site, ctx)])


def known_site(site: str, ctx: Context) -> bool:
    return site != ANY and known(site, ctx)


def open_broadcast(doc: Job, step: Step, ctx: Context, pool: PoolView) -> Decision:
    """The creator names the step's sites, and starts its own part if it has a worker."""
    sites, left_out = broadcast_sites(step, ctx)
    detail = "at " + ", ".join(sites)
    if left_out:
        detail += "; not known sites, left out: " + ", ".join(left_out)

    def edit(new: Job) -> None:
        opened = _current(new)
        opened.update({"runs": {site: new_sub_run() for site in sites},
                       "step_status": "running", "start_time": ctx.now})
        _log(new, "opened", ctx, detail=detail)

    opening = Decision("open", edit, detail=detail)
    worker = pool.worker_for((doc["_id"], doc["step"]))
    if ctx.site not in sites or worker is None:
        return opening
    return in_turn(opening, start_sub_run_decision(doc, 0, ctx, worker))


def on_own_sub_run(doc: Job, step: Step, ctx: Context, pool: PoolView) -> Decision:
    """A target site starts its own sub-run on sight: nobody competes for it, so no claim
    and no winner; a sub-run the documents say we run, with no worker behind it (a
    restart), is released in a new epoch and started again."""
    key = (doc["_id"], doc["step"])
    run = counting_runs(step).get(ctx.site)
    if run is None:
        return STAY
    if run.get("status") is None:
        worker = pool.worker_for(key)
        if worker is None:
            return STAY  # a free worker's scan (the claimable view) brings it back
        return start_sub_run_decision(doc, run.get("epoch", 0), ctx, worker)
    if run.get("status") == "running" and key not in pool.running:
        return Decision("release", release_sub_run(ctx, ctx.site, "worker lost (site restarted)"))
    return STAY


def start_sub_run_decision(doc: Job, epoch: int, ctx: Context, worker: str) -> Decision:
    key = (doc["_id"], doc["step"])
    return Decision("start", start_sub_run(ctx, worker), before=(Book(key, worker),),
                    after=(Launch(key, epoch + 1, worker),))


def log_sub_run(doc: Job, name: str, ctx: Context, run: SubRun, *, worker: str | None = None,
                detail: str | None = None) -> None:
    """A history event about a sub-run, in its epoch (the fencing token's half)."""
    doc["history"].append(event(name, step=doc["step"], site=ctx.site, at=ctx.now,
                                worker=worker, epoch=run.get("epoch", 0), detail=detail))


def start_sub_run(ctx: Context, worker: str) -> Edit:
    def edit(doc: Job) -> None:
        run = sub_runs(_current(doc))[ctx.site]
        epoch = run.get("epoch", 0) + 1
        run.update(new_sub_run())
        run.update({"epoch": epoch, "status": "running", "executioner": worker,
                    "start_time": ctx.now, "lease_until": later(ctx.now, ctx.lease)})
        log_sub_run(doc, "started", ctx, run, worker=worker)
    return edit


def release_sub_run(ctx: Context, site: str, reason: str) -> Edit:
    """Give a sub-run back to its site: a new epoch fences off what ran in the old one."""
    def edit(doc: Job) -> None:
        run = sub_runs(_current(doc))[site]
        epoch = run.get("epoch", 0) + 1
        run.update(new_sub_run())
        run["epoch"] = epoch
        log_sub_run(doc, "released", ctx, run, detail=reason)
    return edit


def finish_sub_run(merged: Job, ctx: Context, pool: PoolView, worker: str,
                   outcome: StepOutcome) -> Decision:
    """Record our sub-run's outcome; the creator ends the step in the same revision when
    that completes it (arbitrate_broadcast)."""
    def edit(doc: Job) -> None:
        run = sub_runs(_current(doc))[ctx.site]
        end_sub_run(run, outcome)
        log_sub_run(doc, "finished" if outcome.ok else "failed", ctx, run, worker=worker,
                    detail=outcome.reason)

    decision = Decision("finish", edit, detail=outcome.reason)
    if ctx.site != merged["creator"]:
        return decision
    after = json_copy(merged)
    edit(after)
    ending = broadcast_end(_current(after))
    return decision if ending is None else in_turn(
        decision, end_broadcast(after, ctx, pool, *ending))


def arbitrate_broadcast(doc: Job, step: Step, ctx: Context, pool: PoolView) -> Decision:
    """The creator ends the step once its policy is met, else revokes expired leases.

    A part for a site no configuration of ours names (a document written around the
    rules, or a creator adopted by a site with fewer sites) could never run: the creator
    drops it, saying why, as it leaves such a site out when it opens the step."""
    unknown = [site for site in counting_runs(step) if not known_site(site, ctx)]
    if unknown:
        return Decision("drop", drop_sites(ctx, unknown, "not a known site"),
                        detail=f"not known sites: {', '.join(unknown)}")
    ending = broadcast_end(step)
    if ending is not None:
        return end_broadcast(doc, ctx, pool, *ending)
    expired = [site for site, run in sorted(counting_runs(step).items())
               if site != ctx.site and run.get("status") == "running" and ctx.lease_expired(run)]
    if not expired:
        return STAY
    key = (doc["_id"], doc["step"])
    reasons = [f"lease of {site} expired at {sub_runs(step)[site]['lease_until']}"
               for site in expired]
    edits = [release_sub_run(ctx, site, reason) for site, reason in zip(expired, reasons,
                                                                        strict=True)]

    def edit(new: Job) -> None:
        for release_one in edits:
            release_one(new)

    return Decision("revoke", edit, before=tuple(Revoke(key, site) for site in expired),
                    detail="; ".join(reasons))


def broadcast_end(step: Step) -> tuple[bool, str] | None:
    """Whether the step ended by its policy (ok, why); None while it must wait.

    `all` (the default): every site must succeed, and the step fails as soon as one
    site's run failed (after its own retries and alt_do). `any`: the step waits for
    every site and succeeds if one did. Dropped sites count neither way.
    """
    runs = counting_runs(step)
    failed = sorted(site for site, run in runs.items() if run.get("status") == "failed")
    finished = sorted(site for site, run in runs.items() if run.get("status") == "finished")
    if each_policy(step) == "all":
        if failed:
            return False, f"failed at {', '.join(failed)} (each_policy all)"
        if len(finished) == len(runs):
            return True, f"finished at every site ({len(runs)})"
        return None
    if len(failed) + len(finished) < len(runs):
        return None
    if finished:
        return True, f"finished at {len(finished)} of {len(runs)} sites (each_policy any)"
    return False, f"failed at every site ({len(runs)}, each_policy any)"


def end_broadcast(doc: Job, ctx: Context, pool: PoolView, ok: bool, reason: str) -> Decision:
    """The creator ends the step, and goes on to the next one as a finish does."""
    def edit(new: Job) -> None:
        step = _current(new)
        step.update({"step_status": "finished" if ok else "failed", "finish_time": ctx.now})
        _log(new, "finished" if ok else "failed", ctx, detail=reason)
        end_current_step(new, ok)

    decision = Decision("finish" if ok else "fail", edit, detail=reason)
    return chain_next(doc, decision, ctx, pool) if ok else decision


def drop_problem(doc: Job, ctx: Context, site: str) -> str | None:
    """Why `site` cannot be dropped from the job's current step here (None: it can)."""
    if not is_live(doc):
        return f"the job already ended: {doc['job_status'] or 'every step done'}"
    if ctx.site != doc["creator"]:
        return f"only the job's creator drops sites: run this at {doc['creator']} (--site)"
    index, step = doc["step"], _current(doc)
    if not is_broadcast(step):
        return f"step {index} is not a broadcast step"
    if step.get("runs") is None:
        return f"step {index} is not open yet: its creator has not named its sites"
    if site not in sub_runs(step):
        return f"{site} is not one of step {index}'s sites ({', '.join(sub_runs(step))})"
    if site in dropped_sites(step):
        return f"{site} was dropped from step {index} already"
    status = sub_runs(step)[site].get("status")
    if status in ("finished", "failed"):
        return f"{site}'s run of step {index} already {status}"
    return None


def plan_drop(leaves: Sequence[Leaf], ctx: Context, site: str, reason: str) -> Plan:
    """An operator removes a site lost for good from the current broadcast step: the
    step then finishes without it (`jobdist drop-site`). Written at the creator, which
    ends the step when the rest are done; its `dropped` event names the site first."""
    if not leaves:
        return NOTHING
    merged = merge(leaves)
    if drop_problem(merged, ctx, site) is not None:
        return NOTHING

    return finalize(leaves, merged, Decision("drop", drop_sites(ctx, [site], reason),
                                             detail=f"{site}: {reason}"), ctx)


def drop_sites(ctx: Context, sites: list[str], reason: str) -> Edit:
    """Remove sites from the current broadcast step's set; a `dropped` event names each."""
    def edit(doc: Job) -> None:
        step = _current(doc)
        step["dropped"] = sorted({*dropped_sites(step), *sites})
        for site in sites:
            log_sub_run(doc, "dropped", ctx, sub_runs(step)[site], detail=f"{site}: {reason}")
    return edit
