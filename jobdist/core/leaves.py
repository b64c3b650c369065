"""Merging a job's live leaf revisions into one view, and choosing which leaves to merge.

Why all leaves and not the winner alone: CouchDB picks the winner of
concurrent revisions by history length and then by hash, which knows nothing
of our protocol: a stale claim or a keep-alive re-save can beat the creator's
win on the hash. We order leaves by *progress* instead: a leaf where the job
succeeded first (succeeded), then per step the epoch, then the phase (open <
claimed < won < running < done), earlier steps first. Epochs only grow, and only
a win, a direct start or a release raises one, so the merge of all leaves is the
furthest any site has got, and every site that has the same leaves derives the
same state. (Words as in docs/protocol.md's glossary.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ..model import (
    Doc,
    Event,
    Job,
    Leaf,
    Progress,
    Step,
    SubRun,
    dropped_sites,
    is_broadcast,
    is_live,
    json_copy,
    newer_format,
    normalise,
    step_phase,
    sub_runs,
)
from ..validation import (
    format_errors,
    validate_job,
)
from .types import Unusable


def couch_order(doc: Leaf) -> tuple[int, str]:
    """CouchDB's own winner order: longest history, then highest rev string."""
    number, digest = doc["_rev"].split("-", 1)
    return int(number), digest


def progress_rank(doc: Job) -> tuple[tuple[int, int], ...]:
    """How far a leaf got, for the merge to take the furthest: (epoch, phase) step by
    step, earlier steps first. (Not a running step's progress report: latest_progress.)"""
    return tuple((step.get("epoch", 0), int(step_phase(step))) for step in doc["job"])


def succeeded(doc: Job) -> bool:
    """A leaf where the job succeeded outranks any other, however far along by epochs.

    Every step of it ran, in order, and counted once on that branch. Another branch
    may hold a higher epoch at an early step: a creator cut off revoked a lease whose
    run then finished (a result, once a step has ended, is never dropped),
    or a creator cut off and its successor both moved the job on. Taking that branch
    would run a finished job's steps again. Its runs are fenced off as any stale run:
    killed, recorded. A failed or cancelled leaf has no such right: a release still
    beats a revoked run's failure (the step is retried).
    """
    return doc.get("job_status") == "success"


def merge(leaves: Sequence[Leaf]) -> Job:
    """One view of a job from all its live leaves; `_rev` is CouchDB's winner."""
    jobs = [normalise(leaf) for leaf in leaves]
    winner = max(jobs, key=couch_order)
    furthest = max(jobs, key=lambda leaf: (succeeded(leaf), progress_rank(leaf), couch_order(leaf)))
    merged = json_copy(furthest)
    merged["_rev"] = winner["_rev"]
    if len(jobs) == 1:
        return merged
    merged["history"] = union_history(jobs)
    merged["updated_at"] = max(leaf["updated_at"] or "" for leaf in jobs) or None
    # A write made before the creator accepted the job has no creation time
    # (decide.accepting).
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
        # An `adopted` event's `epoch` is its term (succession.term); it is optional
        # in an event: a foreign write may leave it out.
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
    if any(newer_format(leaf) for leaf in leaves):
        return [], []  # a newer release's job: no leaf of it is ours to merge or delete
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
