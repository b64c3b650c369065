"""The core's inputs and outputs: what a site knows (Context, PoolView), what a
worker reports (StepOutcome), and what the core answers (Decision, Plan, effects).

A Decision is one action and an Edit: a function that changes a copy of the
merged job. A Plan is that edit applied, ready to write, with the local effects
the manager carries out before the write (book a worker) and after it (launch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from ..clock import seconds_between
from ..model import (
    Job,
    Progress,
    Reason,
    RunRecord,
    StepKey,
)

Unusable = tuple[str, str]  # (leaf rev, why no site may act on it)


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
    # The finish time of the previous step's run this launch followed (starts.follows):
    # its start is written only while the document still shows that end; None: unknown.
    after: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class PoolView:
    """What the site's workers are doing, as the manager knows it."""

    free_workers: tuple[str, ...] = ()
    booked: Mapping[StepKey, Booking] = field(default_factory=dict)
    running: Mapping[StepKey, Running] = field(default_factory=dict)
    # Steps won here that wait for a worker, and how long each has waited by this
    # site's clock (placement.queues); at most `queue_limit` (0: a win no worker is free
    # for is released at once, as in the thesis the design comes from: README.md).
    queued: Mapping[StepKey, float] = field(default_factory=dict)
    queue_limit: int = 0
    # Of `running`, the executions launched ahead of their start whose start is not
    # written yet (starts.record_late_start).
    ahead: Mapping[StepKey, Running] = field(default_factory=dict)
    # How long the longest free of `free_workers` has been free, by this site's clock
    # (None: not known). Claims wait on it (placement.holds_claims).
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


# The protocol's timing defaults, in seconds; a site's settings override them (the
# heartbeat and every interval derived from these: jobdist/timings.py).
BOOKING_TIMEOUT = 60.0
LEASE = 60.0
SKEW_MARGIN = 10.0
CREATOR_TIMEOUT = 120.0  # seconds of a creator's silence before its successor takes over
CLAIM_DELAY = 2.0  # seconds an assigning creator's open step is left to it (Context)
FED_CLAIM_DELAY = 10.0  # the same, while that creator is feeding this site (Context.fed_by)


def claim_delay_for(sites: int) -> float:
    """The claim delay among `sites` live sites: a creator feeds the others in turn,
    so the time between two of its assignments to one site grows with their number.
    CLAIM_DELAY up to three sites (two others fed), in proportion past them: at nine,
    a fixed 2 s turned nearly one remote step in three into a claim, a win and a run
    (3 revisions instead of 2)."""
    return CLAIM_DELAY * max(1.0, (sites - 1) / 2)


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
    # open steps wait for claims, as in the thesis: README.md).
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
    # seconds of its own clock: live and feeding it, so their steps wait `fed_claim_delay`
    # instead (a claim would race their next assignment: two revisions more for one
    # start). The bound keeps a belief that is wrong from holding a step for ever.
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
        """May the creator revoke this step's (or sub-run's) lease? Only once it ran out
        more than `skew_margin` ago by our clock, and, when tracked, we have also seen it
        unchanged for `lease` + `skew_margin` (docs/protocol.md, "Leases")."""
        deadline = step.get("lease_until")
        if not deadline or seconds_between(deadline, self.now) <= self.skew_margin:
            return False
        if self.lease_silence is None:
            return True
        return self.lease_silence.get(deadline, 0.0) > self.lease + self.skew_margin


class StepOutcome(Protocol):
    """What a worker reports (jobdist.step_run.StepResult has these fields), read-only."""

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
    """A step won here with no worker free: queue it, and start it when one frees."""

    key: StepKey


Effect = Book | Unbook | Launch | Kill | Assign | Revoke | Queue


class Action(StrEnum):
    """What a decision or a plan does; its value names it in logs and metrics (action_*)."""

    NONE = "none"  # nothing to do
    IGNORE = "ignore"  # nothing to do here until the document changes
    QUEUE = "queue"  # a win queued here until a worker frees (no write)
    ACCEPT = "accept"  # the creator stamps a job written without a creation time
    RESOLVE = "resolve"  # the creator writes the merge of conflicting leaves, nothing more
    CLAIM = "claim"
    ASSIGN = "assign"
    START = "start"
    RELEASE = "release"
    REVOKE = "revoke"
    FAIL = "fail"
    FINISH = "finish"
    STALE_FINISH = "stale_finish"
    CANCELLED = "cancelled"  # a run a cancellation killed, recorded
    CANCEL = "cancel"  # an operator cancels the job
    KILL = "kill"
    FREE = "free"  # a booking no longer needed
    READY = "ready"  # a waiting job released
    OPEN = "open"  # a broadcast step's sites named
    DROP = "drop"
    RENEW = "renew"
    ADOPT = "adopt"
    RETRIED = "retried"  # the note of a run's retry


@dataclass(frozen=True)
class Plan:
    action: Action
    doc: Job | None = None  # the revision to write on top of the winning leaf
    deletions: tuple[str, ...] = ()  # losing leaf revs the creator deletes
    before: tuple[Effect, ...] = ()  # carried out before the write
    after: tuple[Effect, ...] = ()  # carried out once the write is acknowledged
    detail: str = ""  # for people: logs
    reason: Reason | None = None  # for programs: metrics

    @property
    def writes(self) -> bool:
        return self.doc is not None or bool(self.deletions)


NOTHING = Plan(Action.NONE)


# The detail of a start on a win the creator gave us, after a claim or an assignment
# alike (Reason.WON_CLAIM, the same for both).
WON_CLAIM = "won the claim"


Edit = Callable[[Job], None]


@dataclass(frozen=True)
class Decision:
    action: Action
    edit: Edit | None = None
    before: tuple[Effect, ...] = ()
    after: tuple[Effect, ...] = ()
    detail: str = ""
    reason: Reason | None = None


STAY = Decision(Action.NONE)


def known(site: Any, ctx: Context) -> bool:
    """Is `site` this site or one of `ctx.known_sites` (any site when that is unset)?"""
    return ctx.known_sites is None or site == ctx.site or site in ctx.known_sites


def in_sequence(*edits: Edit | None) -> Edit:
    """One edit that makes `edits` in order (skipping None), so they share one revision."""
    present = [edit for edit in edits if edit is not None]

    def edit(doc: Job) -> None:
        for each in present:
            each(doc)

    return edit


def after_edit(first: Edit, then: Decision) -> Decision:
    """`then`, its revision written on top of `first`'s edit."""
    return dataclasses.replace(then, edit=in_sequence(first, then.edit))


def in_turn(decision: Decision, follow: Decision) -> Decision:
    """`decision`, then `follow` decided on its result, in one revision."""
    if follow.edit is None:
        return decision
    return dataclasses.replace(decision, edit=in_sequence(decision.edit, follow.edit),
                               before=(*decision.before, *follow.before),
                               after=(*decision.after, *follow.after))
