"""Recording what a run did, and chaining the next step onto its end.

Only a current run advances the job: a finish whose token the document no
longer backs is recorded as a stale finish and changes nothing else, but the
step's epoch when no revision showed that run started (burns_epoch).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..model import (
    Job,
    Leaf,
    Phase,
    Reason,
    StepKey,
    allows,
    is_broadcast,
    is_live,
    json_copy,
    step_phase,
    sub_runs,
)
from .broadcast import broadcast_end, open_broadcast
from .edits import (
    current_step,
    end_current_step,
    end_step,
    end_sub_run,
    log_event,
    note,
    outcome_reason,
    record_outcome,
    release,
    release_sub_run,
)
from .fencing import backs_execution, start_lapsed, win_spent
from .leaves import merge
from .placement import willing
from .revision import finalize
from .starts import (
    START_LAPSED,
    followed_counted_end,
    late_start,
    late_start_edit,
    start_decision,
)
from .types import (
    NOTHING,
    Action,
    Context,
    Decision,
    Edit,
    Plan,
    PoolView,
    StepOutcome,
    after_edit,
    in_turn,
)


def plan_finish(
    leaves: Sequence[Leaf],
    ctx: Context,
    pool: PoolView,
    key: StepKey,
    epoch: int,
    worker: str,
    outcome: StepOutcome,
    *,
    after: str | None = None,
) -> Plan:
    """Record what an execution did; only a current execution advances the job.

    `pool` must already show the execution's worker as free (chain_next may take
    it for the next step). An execution launched ahead of its start whose start was never written
    (late_start) gets its start and its end in one revision, unless it ran on an
    end that no longer counts (a stale finish). `after`: the end of the step before
    that its launch followed (late_start).
    """
    merged = merge(leaves)
    if recorded(merged, key, epoch, ctx.site, worker):
        return NOTHING  # a write the server took, its answer lost: found written on retry
    if not late_start(merged, key, epoch, ctx, after):
        # A run that followed an end no longer counted is stale even in a win of its
        # epoch: a creator that never saw its start may have issued that epoch again.
        stale = not followed_counted_end(merged, key[1], after)
        return finalize(leaves, merged, finish_decision(merged, ctx, pool, key, epoch, worker,
                                                        outcome, stale=stale), ctx)
    step = current_step(merged)
    begin = late_start_edit(step, ctx, worker, outcome.start_time)
    if start_lapsed(step, ctx):
        # The creator may be revoking the win: recorded as run and given back, never a
        # finish a next step could be chained onto (win_lapsed).
        detail = f"{START_LAPSED}: {outcome.reason}"
        return finalize(leaves, merged, after_edit(begin, Decision(
            Action.RELEASE, release(ctx, detail, Reason.START_LAPSED), detail=detail,
            reason=Reason.START_LAPSED)), ctx)
    started = json_copy(merged)
    begin(started)
    then = finish_decision(started, ctx, pool, key, epoch, worker, outcome)
    return finalize(leaves, merged, after_edit(begin, then), ctx)


def recorded(merged: Job, key: StepKey, epoch: int, site: str, worker: str) -> bool:
    """Does the history hold this run's end already? (Its token, (epoch, site), and its
    worker name one run: a second report would be called stale, wrongly.)"""
    return any(entry["event"] in ENDS and entry["step"] == key[1]
               and entry.get("epoch") == epoch and entry["site"] == site
               and entry.get("worker") == worker for entry in merged["history"])


ENDS = frozenset({"finished", "failed", "stale_finish"})  # the events a run's report writes


def finish_decision(merged: Job, ctx: Context, pool: PoolView, key: StepKey, epoch: int,
                    worker: str, outcome: StepOutcome, stale: bool = False) -> Decision:
    """What a run's report does: only a run the merged view backs (fencing.
    backs_execution), in a win not spent (fencing.win_spent), advances the job; any
    other is recorded as a stale finish (or as killed by a cancellation)."""
    if stale or not backs_execution(merged, key, epoch, ctx.site) or win_spent(merged, ctx.site):
        if outcome.cancelled and merged["job_status"] == "cancelled":
            return Decision(Action.CANCELLED, record_cancelled(merged, ctx, key, worker, epoch,
                                                          outcome))
        detail = f"epoch {epoch} is no longer current: {outcome.reason}"
        noted = note(ctx, "stale_finish", key, worker, epoch, detail)
        if not burns_epoch(merged, key, epoch):
            return Decision(Action.STALE_FINISH, noted)

        def burned(doc: Job) -> None:
            noted(doc)
            doc["job"][key[1]]["epoch"] = epoch
        return Decision(Action.STALE_FINISH, burned)
    if outcome.cancelled:
        stopped = f"stopped on this site: {outcome.reason}"
        return Decision(Action.RELEASE, release_sub_run(ctx, ctx.site, stopped)
                        if is_broadcast(current_step(merged)) else release(ctx, stopped))
    if is_broadcast(current_step(merged)):
        return finish_sub_run(merged, ctx, pool, worker, outcome)
    decision = Decision(Action.FINISH, record_outcome(ctx, worker, outcome),
                        detail=outcome.reason, reason=outcome_reason(outcome))
    if outcome.ok:
        decision = chain_next(merged, decision, ctx, pool)
    return decision


def burns_epoch(merged: Job, key: StepKey, epoch: int) -> bool:
    """Is this a run of ours that no revision showed started (launched ahead, its start
    never written: one that followed an end that no longer counts), of a step that is
    still to start in an earlier epoch? Then its stale finish moves that step's epoch up to
    the run's, so no later start here issues the same fencing token again."""
    if not is_live(merged) or not merged["step"] <= key[1] < len(merged["job"]):
        return False
    step = merged["job"][key[1]]
    to_start = key[1] > merged["step"] or step_phase(step) < Phase.WON
    return to_start and not is_broadcast(step) and step.get("epoch", 0) < epoch


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


def chain_next(merged: Job, decision: Decision, ctx: Context, pool: PoolView) -> Decision:
    """Finish, and start the next step here in the same write when we may: nobody else
    writes to a running step, so nobody can compete for the next one."""
    after_finish = json_copy(merged)
    assert decision.edit is not None
    decision.edit(after_finish)
    if not is_live(after_finish):
        return decision
    step = current_step(after_finish)
    if is_broadcast(step):  # its creator opens it: it names the sites (open_broadcast)
        if ctx.site != after_finish["creator"]:
            return decision
        return in_turn(decision, open_broadcast(after_finish, step, ctx, pool))
    key = (after_finish["_id"], after_finish["step"])
    worker = pool.worker_for(key)
    if worker is None or not (allows(step, ctx.site) and willing(step, ctx)) \
            or key in pool.running:
        # (A run of that step still here is a stale one, chained onto a finish
        # that was revoked: it is killed first, once the document shows why.)
        return decision
    return in_turn(decision, start_decision(after_finish, step, ctx, worker, direct=True,
                                            chained=True))


def finish_sub_run(merged: Job, ctx: Context, pool: PoolView, worker: str,
                   outcome: StepOutcome) -> Decision:
    """Record our sub-run's outcome; the creator ends the step in the same revision when
    that completes it (arbitrate_broadcast)."""
    def edit(doc: Job) -> None:
        run = sub_runs(current_step(doc))[ctx.site]
        end_sub_run(run, outcome)
        log_event(doc, "finished" if outcome.ok else "failed", ctx, run=run, worker=worker,
                  detail=outcome.reason, reason=outcome_reason(outcome))

    decision = Decision(Action.FINISH, edit, detail=outcome.reason,
                        reason=outcome_reason(outcome))
    if ctx.site != merged["creator"]:
        return decision
    after = json_copy(merged)
    edit(after)
    ending = broadcast_end(current_step(after))
    return decision if ending is None else in_turn(
        decision, end_broadcast(after, ctx, pool, *ending))


def end_broadcast(doc: Job, ctx: Context, pool: PoolView, ok: bool, reason: str) -> Decision:
    """The creator ends the step, and goes on to the next one as a finish does."""
    def edit(new: Job) -> None:
        step = current_step(new)
        step.update({"step_status": "finished" if ok else "failed", "finish_time": ctx.now})
        log_event(new, "finished" if ok else "failed", ctx, detail=reason)
        end_current_step(new, ok)

    decision = Decision(Action.FINISH if ok else Action.FAIL, edit, detail=reason)
    return chain_next(doc, decision, ctx, pool) if ok else decision
