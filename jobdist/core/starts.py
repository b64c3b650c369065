"""Starting a step: the start decision, launched ahead of its write, and the start
written late.

The manager launches a step as soon as it has planned its start, and writes the
start meanwhile (docs/protocol.md, "Launch ahead"). If that write is lost (a 409:
a newer revision came in between; the server did not answer), the start is
written on the revision that came in between, when that one still lets it be.
"""

from __future__ import annotations

from ..clock import seconds_between
from ..model import (
    Job,
    Phase,
    Reason,
    Step,
    StepKey,
    is_broadcast,
    is_live,
    is_waiting,
    sole_target,
    step_phase,
)
from .edits import current_step, next_step_epoch, start
from .fencing import start_lapsed
from .types import WON_CLAIM, Action, Book, Context, Decision, Edit, Launch, PoolView


def start_decision(doc: Job, step: Step, ctx: Context, worker: str, *, direct: bool,
                   chained: bool = False) -> Decision:
    """Start the step on `worker`; launched ahead of its write unless it is a win near
    its start-by deadline (fresh_win), or `chained` onto an end in the same write
    (chain_next): launched ahead, it would run on an end whose write may be lost, and
    keeping such runs bought no measurable speed (docs/protocol.md, "Launch ahead")."""
    key = (doc["_id"], doc["step"])
    epoch = next_step_epoch(doc) if direct else step.get("epoch", 0)
    ahead = not chained and (direct or fresh_win(step, ctx))
    return Decision(
        Action.START,
        start(ctx, worker, direct=direct),
        before=(Book(key, worker),),
        after=(Launch(key, epoch, worker, ahead=ahead),),
        detail="" if direct else WON_CLAIM,
        reason=None if direct else Reason.WON_CLAIM,
    )


START_LAPSED = "its start was not written before the win's start-by lease passed"


def late_start(doc: Job, key: StepKey, epoch: int, ctx: Context,
               after: str | None = None) -> bool:
    """Does the document still call for the start of an execution (key, epoch) this
    site launched ahead of its start, whose start is not written?

    So it does when the start is still the one start_decision writes: in a win of
    ours of that very epoch; or, for an open or merely claimed step of which we are
    the creator or the only target, in the epoch it issues (the creator alone picks
    winners, and a claim does not move the epoch). And only after the run of the step
    before that the launch followed (`after`, when known: follows): a revocation of
    that run, merged in meanwhile, opens the step again in the same epoch, after a
    run of the step before that ended later than ours began. Never on a job that
    waits: the write with its `ready` was lost (a successor's revision won), and no
    site takes a waiting job.
    """
    if doc["_id"] != key[0] or not is_live(doc) or doc["step"] != key[1] or is_waiting(doc):
        return False
    if not followed_counted_end(doc, key[1], after):
        return False
    step = current_step(doc)
    if is_broadcast(step):
        return False  # (its sub-runs are never launched ahead: broadcast.start_sub_run_decision)
    phase = step_phase(step)
    if phase == Phase.WON:
        return step.get("winner") == ctx.site and step.get("epoch", 0) == epoch
    ours = ctx.site == doc["creator"] or sole_target(step) == ctx.site
    return phase < Phase.WON and ours and next_step_epoch(doc) == epoch


def follows(doc: Job, index: int) -> str | None:
    """Which run of the step before step `index` a start of it follows: that step's
    end, as its finish time (None for the first step)."""
    if index == 0 or index > len(doc["job"]):
        return None
    finish = doc["job"][index - 1].get("finish_time")
    return str(finish) if finish is not None else None


def followed_counted_end(doc: Job, index: int, after: str | None) -> bool:
    """Did a launch of step `index` that followed the end `after` (None: not known)
    follow the end of the step before that the document counts?"""
    return after is None or follows(doc, index) == after


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
    return Decision(Action.START,
                    late_start_edit(step, ctx, running.worker, running.launched_at),
                    detail="launched ahead; its start written late", reason=Reason.LATE_START)


def late_start_edit(step: Step, ctx: Context, worker: str, launched_at: str | None) -> Edit:
    """The start late_start calls for: in the win's epoch, or ours in the next; its time
    the launch's, where known (its lease runs from now)."""
    return start(ctx, worker, direct=step_phase(step) < Phase.WON, at=launched_at)
