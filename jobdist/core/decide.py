"""The one decision a site makes about a job, given its merged view (decide), and
the plan that writes it (plan).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..model import (
    ALL,
    ANY,
    Job,
    Leaf,
    Phase,
    Reason,
    Step,
    allows,
    awaited,
    event,
    is_accepted,
    is_broadcast,
    is_live,
    is_waiting,
    json_copy,
    sole_target,
    step_phase,
    targets,
)
from .broadcast import (
    broadcast_end,
    drop_unknown_parts,
    on_own_sub_run,
    open_broadcast,
    revoke_expired_parts,
)
from .edits import assign, claim, fail_job, release
from .fencing import WIN_LAPSED, WIN_SPENT, settle_local_work, win_lapsed, win_spent
from .finish import end_broadcast
from .leaves import merge
from .placement import (
    NO_WORKER_DETAILS,
    assign_to_room,
    holds_claims,
    no_worker_reason,
    queues,
    willing,
)
from .revision import finalize
from .starts import record_late_start, start_decision
from .succession import SHOWN_LIVE, adopt, shown_live_after_end, silence, succeeds
from .types import (
    NOTHING,
    STAY,
    WON_CLAIM,
    Action,
    Book,
    Context,
    Decision,
    Plan,
    PoolView,
    Queue,
    Revoke,
    Unbook,
    Unusable,
    after_edit,
    known,
)
from .wait import on_waiting


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
    # Ended, yet the winning leaf shows it live: its creator ended it on its branch and
    # died before it deleted a longer live branch (its predecessor's, which renewed a
    # lease meanwhile). Its successor adopts the job to clean the conflict.
    if decision == STAY and shown_live_after_end(leaves, merged) and succeeds(merged, ctx):
        decision = adopt(merged, ctx, f"{silence(merged, ctx)} (automatic succession: "
                         f"{SHOWN_LIVE})")
        merged = {**merged, "creator": ctx.site}  # we clean its conflicts now (finalize)
    if ctx.site == merged["creator"] and not is_accepted(merged):
        decision = accepting(decision, ctx)
    return finalize(leaves, merged, decision, ctx, rejected)


def accepting(decision: Decision, ctx: Context) -> Decision:
    """The decision, in a revision that also accepts the job.

    A job written over HTTP may leave out its creation time. Its creator's
    first revision stamps it, whatever else it does: a creation time set by
    one site only, so that every leaf agrees on it (same_job). The other sites
    leave the job alone until then (decide).
    """
    def accept(doc: Job) -> None:
        doc["created_at"] = ctx.now
        doc["history"].append(event("created", step=doc["step"], site=ctx.site, at=ctx.now,
                                    detail="accepted: written without a creation time"))

    action = decision.action if decision.edit is not None else Action.ACCEPT
    return dataclasses.replace(after_edit(accept, decision), action=action)


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
    if is_waiting(doc):
        waits = on_waiting(doc, ctx)
        return waits if waits is not None else released_from_wait(doc, ctx, pool)
    step = doc["job"][doc["step"]]
    if ctx.site == doc["creator"] and not runnable_anywhere(step, ctx):
        return Decision(Action.FAIL,
                        fail_job(ctx, f"no known site matches target {step['target']!r}"))
    if is_broadcast(step) and step_phase(step) < Phase.DONE:
        return on_broadcast(doc, step, ctx, pool)
    holder = step_holder(step)
    waiting = Phase.OPEN < step_phase(step) < Phase.DONE
    if ctx.site == doc["creator"] and waiting and not known(holder, ctx):
        # No site of ours will ever start, run or finish it: give it back at once.
        detail = f"held by {holder!r}, which is not a known site"
        return Decision(Action.RELEASE, release(ctx, detail), detail=detail)
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
            return on_claimed(doc, step, ctx)
        case Phase.WON:
            return on_won(doc, step, ctx, pool)
        case Phase.RUNNING:
            return on_running(doc, step, ctx, pool)
        case Phase.DONE:
            # Our writes always advance past an ended step; only a foreign
            # write leaves one current. The creator ends the job rather than guess.
            if ctx.site != doc["creator"]:
                return STAY
            return Decision(Action.FAIL,
                            fail_job(ctx, "inconsistent: the current step already ended"))


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
        return Decision(Action.IGNORE, detail=reason)
    return Decision(Action.FAIL, fail_job(ctx, f"{reason}: nobody can arbitrate it"),
                    detail=reason)


def runnable_anywhere(step: Step, ctx: Context) -> bool:
    """Does the step's target name a site that can run it? `any` names no site of a
    broadcast step (broadcast_sites leaves it out): opened at none, it would count as
    finished with no run."""
    if ctx.known_sites is None:
        return True
    wildcards = (ALL,) if is_broadcast(step) else (ANY, ALL)
    return any(t in wildcards or t in ctx.known_sites for t in targets(step))


def on_open(doc: Job, step: Step, ctx: Context, pool: PoolView) -> Decision:
    key = (doc["_id"], doc["step"])
    if allows(step, ctx.site) and not willing(step, ctx):
        # Until the job changes: scans would offer it again and again.
        return Decision(Action.IGNORE, detail="its command is not in this site's allow list")
    worker = pool.worker_for(key) if allows(step, ctx.site) else None
    if worker is not None and (ctx.site == doc["creator"] or sole_target(step) == ctx.site):
        # No other site can compete (sole target), or we are the arbiter
        # ourselves: start at once, in one revision instead of three.
        return start_decision(doc, step, ctx, worker, direct=True)
    if ctx.site == doc["creator"]:
        return assign_to_room(doc, step, ctx)
    # A worker booked for this very step: our claim was decided and its write lost
    # (a 409, the server down): claim again, the wait is over.
    if worker is None or (key not in pool.booked and holds_claims(doc, ctx, pool)):
        return STAY
    return Decision(Action.CLAIM, claim(ctx), before=(Book(key, worker),))


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
    if then.edit is None or then.action == Action.IGNORE:
        return Decision(Action.READY, mark, detail=detail)
    return dataclasses.replace(after_edit(mark, then), detail=then.detail or detail)


def on_claimed(doc: Job, step: Step, ctx: Context) -> Decision:
    if ctx.site != doc["creator"]:
        return STAY  # only the creator picks the winner
    return Decision(Action.ASSIGN, assign(ctx), detail=f"winner {step['claimed_by']}")


def on_won(doc: Job, step: Step, ctx: Context, pool: PoolView) -> Decision:
    if step["winner"] != ctx.site:
        return revoke_if_expired(doc, step, ctx)
    key = (doc["_id"], doc["step"])
    booked = (Unbook(key),) if key in pool.booked else ()
    if win_lapsed(step, ctx):
        return Decision(Action.RELEASE, release(ctx, WIN_LAPSED, Reason.WIN_LAPSED),
                        before=booked, detail=WIN_LAPSED, reason=Reason.WIN_LAPSED)
    if win_spent(doc, ctx.site):
        return Decision(Action.RELEASE, release(ctx, WIN_SPENT), before=booked,
                        detail=WIN_SPENT)
    worker = pool.worker_for(key)
    if worker is not None:
        return start_decision(doc, step, ctx, worker, direct=False)
    taken = pool.oldest_undecided()
    if taken is None and queues(doc, key, pool, ctx):
        return Decision(Action.QUEUE, before=(Queue(key),), detail="won; waits for a worker here")
    if taken is None:
        reason = no_worker_reason(doc, key, pool, ctx)
        detail = NO_WORKER_DETAILS[reason]
        return Decision(Action.RELEASE, release(ctx, detail, reason), detail=detail,
                        reason=reason)
    # A decided win beats an undecided claim: without this, a site whose claims
    # outlive its bookings wins steps it can never start, and releases them forever.
    other, worker = taken
    decision = start_decision(doc, step, ctx, worker, direct=False)
    return dataclasses.replace(
        decision, before=(Unbook(other), *decision.before), reason=Reason.WON_CLAIM,
        detail=f"{WON_CLAIM}; worker taken from the claim on {other[0]} step {other[1]}")


def on_running(doc: Job, step: Step, ctx: Context, pool: PoolView) -> Decision:
    key = (doc["_id"], doc["step"])
    winner = step.get("winner")  # a foreign write may have left it out
    if winner == ctx.site and key not in pool.running:
        # Our promise with no worker behind it: the site restarted mid-step.
        return Decision(Action.RELEASE, release(ctx, "worker lost (site restarted)"))
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
    return Decision(Action.REVOKE, release(ctx, detail), before=silent, detail=detail)


def on_broadcast(doc: Job, step: Step, ctx: Context, pool: PoolView) -> Decision:
    if step.get("runs") is None:
        return open_broadcast(doc, step, ctx, pool) if ctx.site == doc["creator"] else STAY
    own = on_own_sub_run(doc, step, ctx, pool)
    if own != STAY or ctx.site != doc["creator"]:
        return own
    return arbitrate_broadcast(doc, step, ctx, pool)


def arbitrate_broadcast(doc: Job, step: Step, ctx: Context, pool: PoolView) -> Decision:
    """The creator ends the step once its policy is met, else revokes expired leases."""
    dropping = drop_unknown_parts(step, ctx)
    if dropping is not None:
        return dropping
    ending = broadcast_end(step)
    if ending is not None:
        return end_broadcast(doc, ctx, pool, *ending)
    return revoke_expired_parts(doc, step, ctx)
