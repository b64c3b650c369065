"""Jobs that wait: for other jobs to end (`after`), for a time (`not_before`).

Policy, not safety: a waiting job has no open step, so nothing here can start a
run; it only decides when the creator lets the job's first step open.
"""

from __future__ import annotations

from ..clock import seconds_between
from ..model import (
    Job,
    Reason,
    after_policy,
    awaited,
)
from .edits import fail_job
from .types import STAY, Action, Context, Decision


def on_waiting(doc: Job, ctx: Context) -> Decision | None:
    """A job that waits (model.is_waiting): its creator alone decides when it may start;
    None once it may (decide.released_from_wait writes the `ready` event).

    Other sites cannot know reliably how the awaited jobs ended, nor agree on
    "now": they leave it alone until the creator's `ready` event reaches them.
    """
    if ctx.site != doc["creator"]:
        return STAY
    failure = awaited_failure(doc, ctx)
    if failure is not None:
        return Decision(Action.FAIL, fail_job(ctx, failure, Reason.WAITED_FOR), detail=failure,
                        reason=Reason.WAITED_FOR)
    return STAY if still_waits(doc, ctx) else None


def awaited_failure(doc: Job, ctx: Context) -> str | None:
    """Why the job can never start: an awaited job that failed or was cancelled."""
    if after_policy(doc) == "always":
        return None
    for job_id in awaited(doc):
        status = ctx.ended.get(job_id)
        if status == "failed":
            return f"waited for {job_id}, which failed"
        if status == "cancelled":
            return f"waited for {job_id}, which was cancelled"
    return None


def still_waits(doc: Job, ctx: Context) -> bool:
    """Does the job still wait, by its creator's knowledge and clock: for an awaited job
    not seen ended, or for its `not_before` time?"""
    not_before = doc.get("not_before")
    return any(job_id not in ctx.ended for job_id in awaited(doc)) or bool(
        not_before and seconds_between(ctx.now, not_before) > 0)
