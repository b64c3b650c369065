"""Placement policy: which site runs an open step, and when.

The line (claim_rank, line_place) orders open steps the same way at every
site; the creator assigns steps to sites it knows have room; other sites hold
their claims while an assigning creator feeds them; a winner with no free
worker queues its win for a while; the keep-alive re-saves only what some
site has room to start. None of it decides safety: a wrong choice costs a
revision or a wait, never a second run of one epoch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from ..clock import parse_time, seconds_between
from ..model import (
    Job,
    Leaf,
    Reason,
    Step,
    StepKey,
    allows,
    sole_target,
)
from ..validation import (
    is_integer,
    is_iso_utc,
)
from .edits import assign, current_step
from .types import STAY, Action, Assign, Context, Decision, PoolView, known

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


def willing(step: Step, ctx: Context) -> bool:
    """Would this site take the step, given its allow-list? Another target may run
    a command we refuse; a step with us as its only target is taken, and refused
    with the reason when it runs, so that the job fails rather than waits forever."""
    if ctx.runs is None or sole_target(step) == ctx.site:
        return True
    return ctx.runs(step["do"])


def holds_claims(doc: Job, ctx: Context, pool: PoolView) -> bool:
    """Does this site leave the creator's open step to its assignment, for now?

    It does until the step has been open, and a worker of ours free, for the delay:
    then the creator had the time to give us work and did not. (The step's age alone
    says nothing in a burst: steps wait in the creator's line while it feeds us, and
    claims on them would race its assignments, each a claim and a win more.) The age
    is by the document's own times: clocks that disagree only move when a site falls
    back to claiming, never who wins.
    """
    creator = doc["creator"]
    if creator not in ctx.assigning:
        return False
    delay = ctx.fed_claim_delay if creator in ctx.fed_by else ctx.claim_delay
    touched = doc.get("updated_at") or doc.get("created_at")
    open_long_enough = not touched or seconds_between(touched, ctx.now) >= delay
    return not open_long_enough or (pool.idle_for is not None and pool.idle_for < delay)


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
    return Decision(Action.ASSIGN, assign(ctx, site), before=(Assign(key, site),),
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


# Why a winner gives a step back unstarted, in words. The creator acts on the code
# (status.Board.saw_job): it stops queueing steps at that site for a while.
NO_WORKER_DETAILS = {
    Reason.NO_WORKER: "won but no worker is free",  # and the site queues no wins
    Reason.NO_WORKER_IN_TIME: "won, but no worker freed within half the start-by lease",
    Reason.QUEUE_FULL: "won but no worker is free, and the queue is full",
}


def no_worker_reason(doc: Job, key: StepKey, pool: PoolView, ctx: Context) -> Reason:
    if queued_too_long(doc, key, pool, ctx):
        return Reason.NO_WORKER_IN_TIME
    return Reason.QUEUE_FULL if pool.queue_limit else Reason.NO_WORKER


def queues(doc: Job, key: StepKey, pool: PoolView, ctx: Context) -> bool:
    """Does this site queue a win no worker is free for, rather than release it?

    Queued, it starts on the next worker that frees, with no replication hop:
    released, it goes back to the creator and comes back by a claim and a win.
    At most `pool.queue_limit` are queued, none for half its start-by lease or
    more (queued_too_long): the creator revokes only a lease silent for the whole
    lease and the skew margin, so the start, or the release, reaches it first.
    """
    queued_elsewhere = sum(1 for other in pool.queued if other != key)
    return queued_elsewhere < pool.queue_limit and not queued_too_long(doc, key, pool, ctx)


def queued_too_long(doc: Job, key: StepKey, pool: PoolView, ctx: Context) -> bool:
    """Is half the win's start-by lease gone, by our own count of how long we queue it, or
    by the win's own times (its `won` event and its `lease_until`, both the creator's
    clock, against ours)? Our count restarts with the daemon; the win's times do not,
    as far as the clocks agree."""
    if pool.queued.get(key, 0.0) >= ctx.lease / 2:
        return True
    step = current_step(doc)
    won_at = next((entry.get("at") for entry in reversed(doc["history"])
                   if entry.get("event") == "won" and entry.get("step") == key[1]
                   and entry.get("epoch", 0) == step.get("epoch", 0)), None)
    deadline = step.get("lease_until")
    if not won_at or not deadline:
        return False  # (its `won` event shed from a full history: our own count alone)
    return seconds_between(won_at, ctx.now) >= seconds_between(won_at, deadline) / 2


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
