"""The revision a plan writes: the decision's edit on a copy of the merge, the
losing leaves the creator deletes, and the size limit kept.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..model import (
    Job,
    Leaf,
    RunRecord,
    event,
    json_copy,
    normalise,
    sub_runs,
)
from ..validation import (
    MAX_DOC_SIZE,
    json_length,
    json_size,
    json_size_over,
)
from .leaves import same_content
from .types import Action, Context, Decision, Plan, Unusable


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
    if action == Action.NONE and (doc is not None or deletions):
        action = Action.RESOLVE
    if doc is not None:
        doc.pop("_conflicts", None)
        fit(doc, keep_events_from=len(merged["history"]))
    return Plan(action, doc, deletions, decision.before, decision.after, decision.detail,
                decision.reason)


def record_rejected(doc: Job, ctx: Context, rejected: Sequence[Unusable]) -> None:
    """An `invalid` event per rejected leaf, once: a deletion that failed is tried again."""
    index = min(doc["step"], len(doc["job"]) - 1)
    for rev, reason in rejected:
        detail = f"revision {rev} skipped: {reason}"[:MAX_DETAIL]
        if not any(entry["event"] == "invalid" and (entry.get("detail") or "").startswith(
                f"revision {rev} ") for entry in doc["history"]):
            doc["history"].append(event("invalid", step=index, site=ctx.site, at=ctx.now,
                                        detail=detail))


MAX_DETAIL = 1000  # characters of an event's detail we write, or keep when short of room


# Events shed, oldest first, when a revision is over the size limit. Never a `started`
# or a `stale_finish`: each records a fencing token used, which fencing.win_spent
# reads so that no later win gives that token to a second run.
BOOKKEEPING_EVENTS = ("claimed", "won", "released", "retried")


def fit(doc: Job, keep_events_from: int, limit: int = MAX_DOC_SIZE) -> None:
    """Shed what matters least until the revision fits under the server's size limit.

    Outputs and history grow with every step; past the limit every write is refused
    and the job could never end. Events from `keep_events_from` on are this
    revision's own, and stay: a write that only fits without its own event (a claim
    on a full document) is better refused. The size is kept up to date piece by
    piece: measuring 1 MiB takes milliseconds. A revision far below the limit, nearly
    every one, is measured no further than its Python text (json_size_over):
    respelling its numbers as JavaScript would was a third of this check on every
    decision.
    """
    if not json_size_over(doc, limit):
        return
    # Oldest first, the least useful first; each step sheds nothing once it fits.
    outputs = with_output(doc)
    size = shed_outputs(outputs[:-1], json_size(doc), limit)
    size = shed_bookkeeping(doc, size, limit, keep_events_from)
    size = shed_long_details(doc, size, limit, keep_events_from)
    shed_outputs(outputs[-1:], size, limit)


def with_output(doc: Job) -> list[RunRecord]:
    """The records holding an output, oldest step first: steps, and broadcast sub-runs."""
    records = [record for step in doc["job"] for record in (step, *sub_runs(step).values())]
    return [record for record in records if record.get("output") is not None]


def shed_outputs(records: list[RunRecord], size: int, limit: int) -> int:
    for record in records:
        if size <= limit:
            break
        size -= json_length(record["output"]) - json_length(None)
        record["output"] = None
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
