"""How each decision changes the job document: one Edit a protocol move.

Every edit appends the history event that says what it did, in the step's
epoch: the history is how a run is explained afterwards.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from ..clock import later
from ..model import (
    Event,
    Job,
    Reason,
    RunRecord,
    RunStatus,
    Step,
    StepKey,
    SubRun,
    dropped_sites,
    event,
    new_sub_run,
    sub_runs,
)
from .types import Context, Edit, StepOutcome


def current_step(doc: Job) -> Step:
    return doc["job"][doc["step"]]


def log_event(doc: Job, name: str, ctx: Context, *, run: SubRun | None = None,
              worker: str | None = None, detail: str | None = None, at: str | None = None,
              reason: Reason | None = None) -> None:
    """A history event about the current step (call before the step index moves), or
    about its sub-run `run`, in that record's epoch; `at` now unless given."""
    index = doc["step"]
    record: Step | SubRun = doc["job"][index] if run is None else run
    doc.setdefault("history", []).append(
        event(name, step=index, site=ctx.site, at=at or ctx.now, worker=worker,
              epoch=record.get("epoch", 0), detail=detail, reason=reason)
    )


def next_epoch(doc: Job, own: int, counts: Callable[[Event], bool]) -> int:
    """An epoch to issue at the current step: above `own` (the record's), and above
    every epoch the step's history events that `counts` carry.

    The record alone is not enough: a branch where an earlier step went back
    outranks the branch that ran this step and drops its epochs. The events stay:
    each write logs one in the revision that issues its epoch, and the merge unions
    histories (leaves.merge), so no fencing token is issued twice, on any branch.
    """
    index = doc["step"]
    recorded = (entry.get("epoch", 0) for entry in doc["history"]
                if entry["step"] == index and counts(entry))
    return max((own, *recorded)) + 1


def next_step_epoch(doc: Job) -> int:
    """The epoch the current plain step's next win, direct start or release issues:
    above every event of that step (an `adopted` event's epoch is a term, not one)."""
    return next_epoch(doc, current_step(doc).get("epoch", 0),
                      lambda entry: entry["event"] != "adopted")


def claim(ctx: Context) -> Edit:
    def edit(doc: Job) -> None:
        current_step(doc)["claimed_by"] = ctx.site
        log_event(doc, "claimed", ctx)
    return edit


def assign(ctx: Context, site: str | None = None) -> Edit:
    """The creator's win: the winner is the step's claimer, or `site`, which the creator
    chose for its room (an assignment, in docs/protocol.md's words), in a new epoch."""
    def edit(doc: Job) -> None:
        step = current_step(doc)
        if site is not None:
            step["claimed_by"] = site
        step["winner"] = step["claimed_by"]
        step["epoch"] = next_step_epoch(doc)
        step["lease_until"] = later(ctx.now, ctx.lease)  # start by then, or be revoked
        detail = f"winner {step['winner']}" + (" (it has room)" if site is not None else "")
        log_event(doc, "won", ctx, detail=detail)
    return edit


def start(ctx: Context, worker: str, *, direct: bool, at: str | None = None) -> Edit:
    """The start of an execution now, or launched `at` (a start written late). `direct`:
    a direct start, which is its own win (this site claimer and winner, a new epoch);
    else the start of the win the creator gave this site, in the win's epoch."""
    def edit(doc: Job) -> None:
        step = current_step(doc)
        if direct:
            step["claimed_by"] = step["winner"] = ctx.site
            step["epoch"] = next_step_epoch(doc)
        step["step_status"] = "running"
        step["executioner"] = worker
        step["start_time"] = at or ctx.now
        step["lease_until"] = later(ctx.now, ctx.lease)
        step["progress"] = None  # a new execution has reported nothing yet
        log_event(doc, "started", ctx, worker=worker, at=at)
    return edit


def release(ctx: Context, detail: str, reason: Reason | None = None) -> Edit:
    """Give the step back: a new epoch fences off whatever ran in the old one."""
    def edit(doc: Job) -> None:
        step = current_step(doc)
        step.update({"claimed_by": None, "winner": None, "executioner": None,
                     "step_status": None, "start_time": None, "lease_until": None,
                     "progress": None})
        step["epoch"] = next_step_epoch(doc)
        log_event(doc, "released", ctx, detail=detail, reason=reason)
    return edit


def fail_job(ctx: Context, detail: str, reason: Reason | None = None) -> Edit:
    def edit(doc: Job) -> None:
        current_step(doc)["step_status"] = "failed"
        doc["job_status"] = "failed"
        log_event(doc, "failed", ctx, detail=detail, reason=reason)
    return edit


def note(ctx: Context, name: str, key: StepKey, worker: str, epoch: int, detail: str) -> Edit:
    """A history event about a run (key, epoch) that changes nothing else: unlike
    log_event, the run need not be the current step's, nor in its epoch (a stale
    finish, a cancelled run, a retry)."""
    def edit(doc: Job) -> None:
        doc.setdefault("history", []).append(
            event(name, step=key[1], site=ctx.site, at=ctx.now, worker=worker,
                  epoch=epoch, detail=detail)
        )
    return edit


def end_step(step: Step, outcome: StepOutcome) -> None:
    """What an execution did, on its step."""
    step["step_status"] = ended(outcome)
    record_end(step, outcome)


def end_sub_run(run: SubRun, outcome: StepOutcome) -> None:
    """What an execution did, on its broadcast sub-run."""
    run["status"] = ended(outcome)
    record_end(run, outcome)


def ended(outcome: StepOutcome) -> RunStatus:
    return "finished" if outcome.ok else "failed"


def record_end(record: RunRecord, outcome: StepOutcome) -> None:
    """The fields an execution's end sets, on its step or its sub-run alike."""
    record.update({
        "exec_time": round(outcome.exec_time, 6),
        "start_time": outcome.start_time,
        "finish_time": outcome.finish_time,
        "attempts": outcome.attempts,
        "exit_code": outcome.exit_code,
        "lease_until": None,
        "output": {"stdout": outcome.stdout, "stderr": outcome.stderr},
    })
    if outcome.progress is not None:  # the last report, even one no heartbeat carried yet
        record["progress"] = copy.copy(outcome.progress)


def record_outcome(ctx: Context, worker: str, outcome: StepOutcome) -> Edit:
    def edit(doc: Job) -> None:
        end_step(current_step(doc), outcome)
        log_event(doc, "finished" if outcome.ok else "failed", ctx, worker=worker,
                  detail=outcome.reason, reason=outcome_reason(outcome))
        end_current_step(doc, outcome.ok)
    return edit


def outcome_reason(outcome: StepOutcome) -> Reason | None:
    """The code of a run's end: only a step its alt_do saved has one."""
    return Reason.ALT_DO if outcome.ok and outcome.used_alt else None


def end_current_step(doc: Job, ok: bool) -> None:
    """The job moves to its next step (or succeeds), or fails."""
    if not ok:
        doc["job_status"] = "failed"
        return
    doc["step"] += 1
    if doc["step"] == len(doc["job"]):
        doc["job_status"] = "success"


def next_sub_run_epoch(doc: Job, site: str) -> int:
    """The epoch `site`'s next start of its part of the current step issues: above its
    part's, and above every epoch the history shows it started that part in (a
    release's event names the site that wrote it, not the part's)."""
    part = sub_runs(current_step(doc)).get(site)
    return next_epoch(doc, part.get("epoch", 0) if part is not None else 0,
                      lambda entry: (entry["event"], entry["site"]) == ("started", site))


def start_sub_run(ctx: Context, worker: str) -> Edit:
    def edit(doc: Job) -> None:
        run = sub_runs(current_step(doc))[ctx.site]
        epoch = next_sub_run_epoch(doc, ctx.site)
        run.update(new_sub_run())
        run.update({"epoch": epoch, "status": "running", "executioner": worker,
                    "start_time": ctx.now, "lease_until": later(ctx.now, ctx.lease)})
        log_event(doc, "started", ctx, run=run, worker=worker)
    return edit


def release_sub_run(ctx: Context, site: str, reason: str) -> Edit:
    """Give a sub-run back to its site: a new epoch fences off what ran in the old one."""
    def edit(doc: Job) -> None:
        run = sub_runs(current_step(doc))[site]
        # One above the part's epoch is enough: a release issues no token, it only has
        # to outrank the run it ends (leaves.sub_run_rank); the part's next start goes
        # above every start of its site the history shows (next_sub_run_epoch).
        epoch = run.get("epoch", 0) + 1
        run.update(new_sub_run())
        run["epoch"] = epoch
        log_event(doc, "released", ctx, run=run, detail=reason)
    return edit


def drop_sites(ctx: Context, sites: list[str], reason: str) -> Edit:
    """Remove sites from the current broadcast step's set; a `dropped` event names each."""
    def edit(doc: Job) -> None:
        step = current_step(doc)
        step["dropped"] = sorted({*dropped_sites(step), *sites})
        for site in sites:
            log_event(doc, "dropped", ctx, run=sub_runs(step)[site], detail=f"{site}: {reason}")
    return edit
