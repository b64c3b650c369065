"""Who creates a job: adoption terms and automatic succession.

The creator arbitrates a job (picks winners, revokes leases, keeps it alive).
When its status goes silent for `creator_timeout`, the first site of the job's
succession order (its origin, then the origin's successors) that is not silent
takes it over (succeeds) with an `adopted` event that carries the new term
(in its `epoch` field, a name the document format keeps: the term is no fencing
token); the merge takes the creator of the highest term.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..model import (
    Job,
    Leaf,
    event,
    is_accepted,
    is_live,
    normalise,
)
from .leaves import couch_order
from .types import Action, Context, Decision


def term(doc: Job) -> int:
    """The highest adoption term the job's history knows (0: none)."""
    return max((entry.get("epoch", 0) for entry in doc.get("history", [])
                if entry["event"] == "adopted"), default=0)


SHOWN_LIVE = "the job ended, but its winning revision still shows it live"


def shown_live_after_end(leaves: Sequence[Leaf], merged: Job) -> bool:
    """Has the job ended (the merge) while CouchDB's winning leaf still says it is live?

    Only the creator cleans conflicts (finalize), and views read the winning leaf:
    if the creator is gone, such a job shows live forever, and a live winner is
    never written again (every site's merge says the job ended).
    """
    return not is_live(merged) and is_live(normalise(max(leaves, key=couch_order)))


def adopt(doc: Job, ctx: Context, reason: str) -> Decision:
    """This site becomes the job's creator: from then on it arbitrates its claims,
    revokes expired leases and keeps it alive.

    Nothing else changes: a claim waiting for a decision is decided by the new
    creator, a running step keeps its lease. The merge takes the creator of the
    highest term, so a late write of the old creator cannot take the job back.
    If the old creator is in fact alive behind a partition, both sites arbitrate
    until it sees the adoption: a step may then run twice, each run with its own
    token (epoch, winner), fenced and recorded.
    """
    gone = doc["creator"]
    next_term = 1 + term(doc)
    detail = f"creator {gone} -> {ctx.site}: {reason}"

    def edit(new: Job) -> None:
        new["creator"] = ctx.site
        new["history"].append(event("adopted", step=new["step"], site=ctx.site, at=ctx.now,
                                    worker=None, epoch=next_term, detail=detail))

    return Decision(Action.ADOPT, edit, detail=detail)


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

    The job's succession order is its origin and then the origin's successors. When
    the current creator (the origin, or a site that took over before) is silent,
    the first site of that order that is not silent takes over: the next successor
    when the one before went silent too, the origin itself when it is back and the
    site that took over from it is silent. A creator outside its job's order is
    left alone (an operator chose it), and so is a job its creator has not accepted
    yet: its acceptance stamps the creation time that fixes the job's identity, and
    a successor accepting it too, while the creator did on a branch not seen yet,
    would make two jobs of it (decide.accepting).
    """
    creator = doc["creator"]
    if creator == ctx.site or creator not in ctx.silent or not is_accepted(doc):
        return False
    if ctx.unchanged_for is not None and ctx.unchanged_for < ctx.creator_timeout:
        return False
    first = origin(doc)
    order = (first, *ctx.successors.get(first, ()))
    if creator not in order:
        return False
    return next((site for site in order if site != creator and site not in ctx.silent),
                None) == ctx.site
