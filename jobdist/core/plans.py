"""The plans besides a decision: a lease renewed, an event noted, a job cancelled,
adopted, a site dropped, a keep-alive re-save, a refused write ending the job.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from ..clock import later, parse_time, seconds_between
from ..model import (
    Doc,
    Job,
    Leaf,
    Phase,
    Progress,
    StepKey,
    is_accepted,
    is_live,
    is_waiting,
    json_copy,
    newer_format,
    normalise,
    step_phase,
)
from ..validation import (
    validate_job,
)
from .broadcast import drop_problem
from .edits import current_step, drop_sites, fail_job, log_event, note
from .fencing import backs_execution, execution_record, start_lapsed, start_recorded
from .leaves import merge
from .revision import MAX_DETAIL, finalize
from .starts import late_start, late_start_edit
from .succession import SHOWN_LIVE, adopt, shown_live_after_end
from .types import NOTHING, Action, Context, Decision, Plan, Running, after_edit


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
    return finalize(leaves, merged, Decision(Action.FAIL, fail_job(ctx, detail), detail=detail),
                    ctx)


def keepalive(leaves: list[Doc], ctx: Context, stale_after: float) -> Job | None:
    """The re-save that makes other sites look at a forgotten job again, if due: by
    its creator, of an unconflicted document, changing nothing but `keepalive_at`."""
    if len(leaves) != 1 or newer_format(leaves[0]) or validate_job(leaves[0]):
        return None
    doc = normalise(leaves[0])
    if doc["creator"] != ctx.site or not is_live(doc) or not is_accepted(doc):
        return None  # (the manager accepts a job its creator has not yet accepted)
    if step_phase(doc["job"][doc["step"]]) != Phase.OPEN or is_waiting(doc):
        return None  # (a waiting job is for no site to take: nothing to remind them of)
    # (An accepted job has its creation time: `or ""` only tells mypy so.)
    last = max(doc["updated_at"] or doc["created_at"] or "", doc.get("keepalive_at") or "")
    if (parse_time(ctx.now) - parse_time(last)).total_seconds() < stale_after:
        return None
    touched = json_copy(doc)
    touched["keepalive_at"] = ctx.now
    return touched


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
    if not start_recorded(current_step(merged)):
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

    return finalize(leaves, merged, Decision(Action.RENEW, edit), ctx)


def plan_retried(leaves: Sequence[Leaf], ctx: Context, key: StepKey, epoch: int, worker: str,
                 detail: str, ahead: Running | None = None) -> Plan:
    """Append a `retried` event for a running execution, if it is still the current one.
    An execution launched ahead (`ahead`: when, and after what) whose start is not
    written yet gets its start in the same revision, where late_start still calls
    for it."""
    merged = merge(leaves)
    if not is_live(merged):
        return NOTHING
    noted = Decision(Action.RETRIED, note(ctx, "retried", key, worker, epoch, detail))
    step = current_step(merged)
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
            log_event(doc, "cancelled", ctx, detail=reason)

    return finalize(leaves, merged, Decision(Action.CANCEL, edit, detail=reason), ctx)


def plan_drop(leaves: Sequence[Leaf], ctx: Context, site: str, reason: str) -> Plan:
    """An operator removes a site lost for good from the current broadcast step: the
    step then finishes without it (`jobdist drop-site`). Written at the creator, which
    ends the step when the rest are done; its `dropped` event names the site first."""
    if not leaves:
        return NOTHING
    merged = merge(leaves)
    if drop_problem(merged, ctx, site) is not None:
        return NOTHING

    return finalize(leaves, merged, Decision(Action.DROP, drop_sites(ctx, [site], reason),
                                             detail=f"{site}: {reason}"), ctx)
