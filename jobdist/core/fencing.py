"""Fencing: which runs and bookings of this site the job document still backs.

A run's fencing token is (epoch, winner) at its step: two branches of a partition
can issue one epoch number to two sites, and the winner tells them apart. A run
whose token the document no longer shows as current never advances the job
(finish.finish_decision), and once the document has moved past it, the run is
killed (settle_local_work). A document that is merely behind (an old revision
delivered late) kills nothing. A broadcast step's part is fenced by (step, site,
epoch) alike.
"""

from __future__ import annotations

from ..clock import seconds_between
from ..model import (
    Job,
    Phase,
    RunRecord,
    Step,
    StepKey,
    counting_runs,
    dropped_sites,
    is_broadcast,
    is_live,
    step_phase,
    sub_runs,
)
from .edits import current_step
from .types import Action, Booking, Context, Decision, Kill, PoolView, Unbook


def settle_local_work(doc: Job, ctx: Context, pool: PoolView) -> Decision | None:
    """Drop bookings and executions for this job that the document no longer backs.

    Only a document that has moved past our work ends it. One that is behind it
    (an older revision delivered late by the feed, or a job that went back a step:
    a revocation outranks a branch that went on) leaves an execution running, its
    report fenced anyway, and a booking only until the booking timeout (backs_booking).
    """
    job_id = doc["_id"]
    for key, run in pool.running.items():
        if key[0] == job_id and moved_past_execution(doc, key, run.epoch, ctx.site):
            reason = "job cancelled" if doc["job_status"] == "cancelled" else "execution superseded"
            return Decision(Action.KILL, before=(Kill(key, reason),), detail=reason)
    for key, booking in pool.booked.items():
        if key[0] == job_id and not backs_booking(doc, key, booking, ctx):
            return Decision(Action.FREE, before=(Unbook(key),),
                            detail="booking no longer needed")
    return None


def behind(doc: Job, key: StepKey, epoch: int, site: str) -> bool:
    """Is this view of the job older than a step and epoch we already acted on?"""
    if doc["step"] != key[1]:
        return doc["step"] < key[1] and doc["job_status"] is None
    step = doc["job"][key[1]]
    if is_broadcast(step):
        return sub_run_behind(step, epoch, site)
    return step.get("epoch", 0) < epoch


def backs_execution(doc: Job, key: StepKey, epoch: int, site: str) -> bool:
    """Is the execution (key, epoch) at `site` the current one: the step's winner in
    that epoch, or for a broadcast step `site`'s running sub-run in it?"""
    if not is_live(doc) or doc["step"] != key[1]:
        return False
    step = doc["job"][key[1]]
    if is_broadcast(step):
        return backs_sub_run(step, epoch, site)
    return step.get("epoch", 0) == epoch and step.get("winner") == site


def moved_past_execution(doc: Job, key: StepKey, epoch: int, site: str) -> bool:
    return not backs_execution(doc, key, epoch, site) and not behind(doc, key, epoch, site)


def backs_booking(doc: Job, key: StepKey, booking: Booking, ctx: Context) -> bool:
    if behind(doc, key, 0, ctx.site):
        # An old view, or the job really went back a step: a revocation at an earlier
        # step (a higher epoch) outranks the branch where we claimed. Either way the
        # claim is undecided: keep the worker no longer than for any such claim, or
        # the step the job went back to may wait for this very worker for ever.
        return booking.age < ctx.booking_timeout
    if not is_live(doc) or doc["step"] != key[1]:
        return False
    step = doc["job"][key[1]]
    if is_broadcast(step):
        return sub_run_open(step, ctx.site)
    phase = step_phase(step)
    if phase >= Phase.WON:
        # The winner has settled: keep the worker only if we won.
        return step.get("winner") == ctx.site
    # Still undecided: keep waiting for the creator, but not forever.
    return booking.age < ctx.booking_timeout


WIN_LAPSED = "won, but its start-by lease had passed when the win reached us"


def win_lapsed(step: Step, ctx: Context) -> bool:
    """Has our win's start-by lease passed, by our clock? Then it is released, never
    started: the creator may be revoking it at this very moment (decide.revoke_if_expired),
    and a start written concurrently with that revocation would run the step in an
    epoch the merge overturns, and anything chained onto its end with it. Started
    before its deadline, a start has the skew margin to reach the creator first."""
    deadline = step.get("lease_until")
    return deadline is not None and seconds_between(deadline, ctx.now) >= 0


WIN_SPENT = "won in an epoch this site already started the step in"


def win_spent(doc: Job, site: str) -> bool:
    """Is the current step won by `site`, not started, in an epoch the history shows
    `site` ran it in (started it, or recorded a run of it stale)? A creator that never
    saw that run (its branch went back a step, and outranks the branch that ran it, or
    the run's start was never written) can issue the same epoch again. A start would
    give one fencing token two runs, so the win is released instead, in a higher
    epoch; the run that start began, if it goes on, ends as a stale finish."""
    step = current_step(doc)
    index, epoch = doc["step"], step.get("epoch", 0)
    return step_phase(step) == Phase.WON and step.get("winner") == site and any(
        entry["event"] in RAN and (entry["step"], entry["site"], entry.get("epoch", 0))
        == (index, site, epoch) for entry in doc["history"])


RAN = frozenset({"started", "stale_finish"})  # events that show a site ran a step in an epoch


def start_lapsed(step: Step, ctx: Context) -> bool:
    """Is the step a win of ours not started, its start-by lease passed? Then no start
    of it is written, not even late with a run launched ahead (win_lapsed)."""
    return step_phase(step) == Phase.WON and win_lapsed(step, ctx)


def records_start(doc: Job | None, key: StepKey, epoch: int, site: str) -> bool:
    """Does this revision show the execution (key, epoch) started at `site`?"""
    return doc is not None and doc["_id"] == key[0] and backs_execution(doc, key, epoch, site) \
        and step_phase(doc["job"][key[1]]) == Phase.RUNNING


def start_recorded(step: Step) -> bool:
    """Does the step show its execution started? (A broadcast step's parts each say so
    for their site: backs_execution looks there.)"""
    return is_broadcast(step) or step_phase(step) == Phase.RUNNING


def execution_record(doc: Job, site: str) -> RunRecord:
    """Where the current step's execution at `site` is recorded: its sub-run, or the step."""
    step = current_step(doc)
    return sub_runs(step)[site] if is_broadcast(step) else step


def backs_sub_run(step: Step, epoch: int, site: str) -> bool:
    """Fencing for a sub-run: the token is (epoch, site), and only a running sub-run of a
    site still in the step's set counts."""
    run = sub_runs(step).get(site)
    return run is not None and site not in dropped_sites(step) \
        and run.get("status") == "running" and run.get("epoch", 0) == epoch


def sub_run_behind(step: Step, epoch: int, site: str) -> bool:
    """An old view of a sub-run we ran: the step not opened yet, or an older epoch."""
    if step.get("runs") is None:
        return True
    run = sub_runs(step).get(site)
    return run is not None and run.get("epoch", 0) < epoch


def sub_run_open(step: Step, site: str) -> bool:
    """Is `site`'s sub-run waiting for it to start?"""
    run = counting_runs(step).get(site)
    return run is not None and run.get("status") is None


def current_leases(doc: Job) -> list[str]:
    """The lease deadlines of a live job's current step: the step's, or its sub-runs'."""
    if not is_live(doc):
        return []
    step = doc["job"][doc["step"]]
    records = [step, *sub_runs(step).values()]
    return [lease for record in records if (lease := record.get("lease_until"))]
