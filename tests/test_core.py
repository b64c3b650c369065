"""Unit tests of the decision core (jobdist.core): one rule per test, built by hand.

Documents are built with jobdist.model and then edited step field by step field,
so each test states only what matters to it. The last section replays three
cases of the protocol hazards note (/work/shared/notes/protocol-hazards.md) on
the simulated replicated store of jobdist/lab/sim.py, with every delivery chosen by hand.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobdist import core
from jobdist.clock import format_time
from jobdist.core import (
    Action,
    Book,
    Booking,
    Context,
    Kill,
    Launch,
    Plan,
    PoolView,
    Running,
    Unbook,
)
from jobdist.lab.sim import Clock, Execution, Outcome, SimSite, check_no_double_execution
from jobdist.model import (
    JOB_FORMAT,
    Doc,
    Phase,
    Reason,
    event,
    is_live,
    is_waiting,
    json_copy,
    new_job,
    new_step,
    new_sub_run,
    step_phase,
)
from jobdist.validation import MAX_DOC_SIZE, json_size, validate_job

# --- builders -------------------------------------------------------------------

JOB = "job-1"
KEY = (JOB, 0)
CREATOR = "global"
BASE = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> str:
    """The ISO time `seconds` after 2026-01-01T00:00:00Z."""
    return format_time(BASE + timedelta(seconds=seconds))


T0 = at(0)
NOW = at(600)


def job(*step_targets: Any, creator: str = CREATOR, rev: str = "1-a") -> Doc:
    """A fresh job (one step per target, "any" by default) as the leaf `rev`."""
    steps = [new_step(f"echo {n}", target=t) for n, t in enumerate(step_targets or ("any",))]
    doc = new_job(creator, steps, created_at=T0, job_id=JOB)
    doc["_rev"] = rev
    return doc


def step(doc: Doc, index: int | None = None, **fields: Any) -> Doc:
    """Set fields of a step (the current one by default); returns the doc."""
    doc["job"][doc["step"] if index is None else index].update(fields)
    return doc


def claimed(doc: Doc, site: str, epoch: int = 0) -> Doc:
    return step(doc, claimed_by=site, epoch=epoch)


def won(doc: Doc, site: str, epoch: int = 1) -> Doc:
    return step(doc, claimed_by=site, winner=site, epoch=epoch)


def running(doc: Doc, site: str, epoch: int = 1) -> Doc:
    return step(won(doc, site, epoch), step_status="running", executioner=f"{site}/w1",
                start_time=at(10))


def logged(doc: Doc, name: str, site: str, seconds: float, **fields: Any) -> Doc:
    doc["history"].append(event(name, step=doc["step"], site=site, at=at(seconds), **fields))
    return doc


def ctx(site: str = CREATOR, *, now: str = NOW, known: set[str] | None = None,
        timeout: float = 60.0) -> Context:
    return Context(site, now, frozenset(known) if known is not None else None, timeout)


def pool(*free: str, booked: dict[Any, Booking] | None = None,
         running: dict[Any, Running] | None = None) -> PoolView:
    return PoolView(tuple(free), booked or {}, running or {})


def decide(doc: Doc, site: str = CREATOR, the_pool: PoolView | None = None, **kw: Any) -> Plan:
    """The plan of `site` for a document with one leaf."""
    return core.plan([doc], ctx(site, **kw), the_pool or pool())


def events(doc: Doc) -> list[str]:
    return [entry["event"] for entry in doc["history"]]


def current(doc: Doc) -> Doc:
    return doc["job"][doc["step"]]


# --- inputs: the pool view ---------------------------------------------------------

def test_worker_for_prefers_the_worker_booked_for_the_key_then_a_free_one():
    assert pool("a/w2", booked={KEY: Booking("a/w1", 1.0)}).worker_for(KEY) == "a/w1"
    assert pool("a/w2", booked={KEY: Booking("a/w1", 1.0)}).worker_for(("other", 0)) == "a/w2"
    assert pool().worker_for(KEY) is None


def test_oldest_undecided_is_the_booking_made_longest_ago():
    assert pool().oldest_undecided() is None
    view = pool(booked={("j-x", 0): Booking("a/w1", 5.0), ("j-y", 2): Booking("a/w2", 50.0)})
    assert view.oldest_undecided() == (("j-y", 2), "a/w2")


def test_plan_writes_when_it_has_a_doc_or_deletions():
    assert not core.NOTHING.writes
    assert Plan("x", doc={}).writes
    assert Plan("x", deletions=("2-a",)).writes


# --- merging leaves --------------------------------------------------------------

def test_couch_order_is_history_length_then_rev_string():
    revs = ["2-b", "10-a", "9-z", "2-a"]
    by_couch = sorted(revs, key=lambda r: core.couch_order({"_rev": r}))
    assert by_couch == ["2-a", "2-b", "9-z", "10-a"]


def test_merge_of_a_single_leaf_is_a_copy_of_it():
    doc = won(job(rev="3-abc"), "reg_a")
    merged = core.merge([doc])
    assert merged == doc
    merged["job"][0]["winner"] = "reg_b"
    assert doc["job"][0]["winner"] == "reg_a"


def test_json_copy_shares_nothing_a_decision_could_change():
    doc = logged(won(job(), "reg_a"), "won", "global", 3)
    doc["meta"] = {"nested": [{"deep": [1, 2.5, None, True]}], "pair": ("a", {"b": 1})}
    copied = json_copy(doc)
    assert copied == {**doc, "meta": {**doc["meta"], "pair": ["a", {"b": 1}]}}
    copied["job"][0]["winner"] = "reg_b"
    copied["history"][-1]["site"] = "reg_b"
    copied["meta"]["nested"][0]["deep"].append(3)
    copied["meta"]["pair"][1]["b"] = 2
    assert doc["job"][0]["winner"] == "reg_a" and doc["history"][-1]["site"] == "global"
    assert doc["meta"] == {"nested": [{"deep": [1, 2.5, None, True]}], "pair": ("a", {"b": 1})}


def test_merge_takes_the_furthest_leaf_but_keeps_couchs_winning_rev():
    keepalive = job(rev="2-fff")
    keepalive["keepalive_at"] = at(5)
    claim = claimed(job(rev="2-aaa"), "reg_a")
    merged = core.merge([claim, keepalive])
    assert merged["job"][0]["claimed_by"] == "reg_a"
    assert merged["_rev"] == "2-fff"


def test_merge_breaks_equal_progress_by_couch_order():
    a, b = claimed(job(rev="2-aaa"), "reg_a"), claimed(job(rev="2-bbb"), "reg_b")
    assert core.merge([a, b])["job"][0]["claimed_by"] == "reg_b"
    longer = claimed(job(rev="3-000"), "reg_a")
    assert core.merge([b, longer])["job"][0]["claimed_by"] == "reg_a"


def test_merge_earlier_step_progress_dominates_later_steps():
    ahead_on_first = step(step(job("any", "any", rev="2-a"), 0, epoch=1, winner="a",
                               step_status="finished"), 1, epoch=0)
    ahead_on_second = step(step(job("any", "any", rev="2-f"), 0, epoch=1, winner="a",
                                step_status="running"), 1, epoch=7, claimed_by="b")
    assert core.progress_rank(ahead_on_first) > core.progress_rank(ahead_on_second)
    assert core.merge([ahead_on_first, ahead_on_second])["job"][0]["step_status"] == "finished"


def test_merge_a_job_that_succeeded_beats_a_higher_epoch_of_its_last_step():
    """A revoked run that finished the job keeps its result: the release
    the creator wrote meanwhile would run an ended job's step again."""
    finished = step(won(job(rev="4-aaa"), "reg_a", epoch=1), step_status="finished")
    finished.update(step=1, job_status="success")
    released = step(job(rev="4-fff"), epoch=2)
    merged = core.merge([finished, released])
    assert merged["step"] == 1 and merged["job_status"] == "success"
    assert (merged["job"][0]["epoch"], merged["job"][0]["winner"]) == (1, "reg_a")
    assert merged["_rev"] == "4-fff"  # CouchDB's winner still names the revision


def test_merge_a_higher_epoch_beats_a_failed_lower_epoch():
    """A revoked run's failure does not end the job: the release retries the step."""
    failed = step(won(job(rev="4-fff"), "reg_a", epoch=1), step_status="failed")
    failed.update(step=1, job_status="failed")
    released = step(job(rev="4-aaa"), epoch=2)
    merged = core.merge([failed, released])
    assert merged["step"] == 0 and merged["job_status"] is None
    assert merged["job"][0]["epoch"] == 2 and merged["job"][0]["step_status"] is None


def test_merge_unions_histories_without_duplicates_in_time_order():
    a = logged(claimed(job(rev="2-a"), "reg_a"), "claimed", "reg_a", 20)
    b = logged(logged(job(rev="2-b"), "claimed", "reg_b", 10), "released", "reg_b", 30)
    merged = core.merge([a, b])
    assert [(e["event"], e["site"]) for e in merged["history"]] == [
        ("created", CREATOR), ("claimed", "reg_b"), ("claimed", "reg_a"), ("released", "reg_b"),
    ]


def test_merge_does_not_depend_on_the_order_of_the_leaves():
    a = logged(claimed(job(rev="2-a"), "reg_a"), "claimed", "reg_a", 20)
    b = logged(claimed(job(rev="2-b"), "reg_b"), "claimed", "reg_b", 20)
    assert core.merge([a, b]) == core.merge([b, a])


def test_merge_a_cancellation_on_a_losing_leaf_wins():
    cancelled = job(rev="2-a")
    cancelled["job_status"] = "cancelled"
    claim = claimed(job(rev="2-f"), "reg_a")
    merged = core.merge([claim, cancelled])
    assert merged["job_status"] == "cancelled"
    assert merged["job"][0]["claimed_by"] == "reg_a"


@pytest.mark.parametrize("ended", ["success", "failed"])
def test_merge_a_cancellation_loses_to_a_job_that_already_ended(ended):
    cancelled = running(job(rev="4-f"), "reg_a")
    cancelled["job_status"] = "cancelled"
    done = step(won(job(rev="4-a"), "reg_a"), step_status="finished" if ended == "success"
                else "failed")
    done.update(job_status=ended, step=1 if ended == "success" else 0)
    assert core.merge([cancelled, done])["job_status"] == ended


def test_merge_takes_the_latest_updated_at_and_keepalive_at():
    a, b, c = job(rev="2-a"), claimed(job(rev="2-b"), "reg_a"), job(rev="2-c")
    a.update(updated_at=at(50), keepalive_at=at(40))
    b.update(updated_at=at(30))
    c.update(updated_at=at(20), keepalive_at=at(45))
    merged = core.merge([a, b, c])
    assert (merged["updated_at"], merged["keepalive_at"]) == (at(50), at(45))
    assert "keepalive_at" not in core.merge([b, claimed(job(rev="2-d"), "reg_b")])


# --- plan and finalize -------------------------------------------------------------

def test_plan_with_no_leaves_does_nothing():
    assert core.plan([], ctx(), pool("global/w1")) is core.NOTHING


def test_a_job_that_ended_is_left_alone():
    doc = job()
    doc["job_status"] = "cancelled"
    assert decide(doc, CREATOR, pool("global/w1")) == core.NOTHING


def test_edits_set_updated_at_and_drop_conflicts():
    doc = job(rev="2-a")
    doc["_conflicts"] = ["2-0"]
    plan = decide(doc, "reg_a", pool("reg_a/w1"))
    assert plan.action == "claim"
    assert plan.doc["updated_at"] == NOW and "_conflicts" not in plan.doc
    assert plan.doc["_rev"] == "2-a"


def conflicted_won() -> tuple[Doc, Doc]:
    """reg_a won (epoch 1) on 3-aaa; a stale claim by reg_b won CouchDB's hash on 3-fff."""
    assigned = logged(won(job(rev="3-aaa"), "reg_a"), "won", CREATOR, 20, epoch=1)
    stale = logged(claimed(job(rev="3-fff"), "reg_b"), "claimed", "reg_b", 15)
    return assigned, stale


def test_creator_writes_the_merge_when_the_winning_leaf_lacks_progress():
    assigned, stale = conflicted_won()
    plan = core.plan([assigned, stale], ctx(CREATOR), pool())
    assert plan.action == "resolve"
    assert plan.deletions == ("3-aaa",)
    assert plan.doc["_rev"] == "3-fff"  # written on CouchDB's winner, carrying the progress
    assert plan.doc["job"][0]["winner"] == "reg_a" and plan.doc["job"][0]["epoch"] == 1
    assert events(plan.doc) == ["created", "claimed", "won"]


def test_creator_only_deletes_when_the_winning_leaf_already_has_everything():
    assigned = logged(won(job(rev="3-fff"), "reg_a"), "won", CREATOR, 20, epoch=1)
    assigned["updated_at"] = at(20)
    assigned["_conflicts"] = ["2-aaa"]
    original = job(rev="2-aaa")
    plan = core.plan([original, assigned], ctx(CREATOR), pool())
    assert (plan.action, plan.doc, plan.deletions) == ("resolve", None, ("2-aaa",))


def test_creator_cleans_conflicts_in_the_same_plan_as_its_decision():
    claim = claimed(job(rev="2-aaa"), "reg_a")
    keepalive = job(rev="2-fff")
    keepalive["keepalive_at"] = at(30)
    keepalive["_conflicts"] = ["2-aaa"]
    plan = core.plan([claim, keepalive], ctx(CREATOR), pool())
    assert plan.action == "assign" and plan.deletions == ("2-aaa",)
    assert plan.doc["_rev"] == "2-fff" and "_conflicts" not in plan.doc
    assert plan.doc["keepalive_at"] == at(30)


def test_a_non_creator_never_deletes_or_resolves():
    assigned, stale = conflicted_won()
    plan = core.plan([assigned, stale], ctx("reg_b"), pool("reg_b/w1"))
    assert (plan.action, plan.doc, plan.deletions) == ("none", None, ())
    # reg_a won (on the merge, though not on CouchDB's winner): it starts, deleting nothing
    plan = core.plan([assigned, stale], ctx("reg_a"), pool("reg_a/w1"))
    assert plan.action == "start" and plan.deletions == ()


# --- decide: an open step ------------------------------------------------------------

def test_open_step_not_targeted_here_is_left_alone():
    assert decide(job("reg_b"), "reg_a", pool("reg_a/w1")).action == "none"
    assert decide(job(["reg_b", "global"]), "reg_a", pool("reg_a/w1")).action == "none"


def test_open_step_without_a_worker_is_left_alone():
    assert decide(job(), "reg_a", pool()).action == "none"
    assert decide(job(), CREATOR, pool()).action == "none"


def test_creator_starts_an_open_step_directly_with_a_new_epoch():
    plan = decide(job(), CREATOR, pool("global/w1"))
    assert plan.action == "start"
    s = plan.doc["job"][0]
    assert (s["epoch"], s["claimed_by"], s["winner"], s["step_status"], s["executioner"]) == (
        1, CREATOR, CREATOR, "running", "global/w1")
    assert s["start_time"] == NOW
    assert events(plan.doc) == ["created", "started"] and plan.doc["history"][-1]["epoch"] == 1
    assert plan.before == (Book(KEY, "global/w1"),)
    assert plan.after == (Launch(KEY, 1, "global/w1"),)


def test_sole_target_starts_an_open_step_directly():
    doc = step(job(["reg_a"]), epoch=4)
    plan = decide(doc, "reg_a", pool("reg_a/w1"))
    assert plan.action == "start"
    assert plan.doc["job"][0]["winner"] == "reg_a" and plan.doc["job"][0]["epoch"] == 5
    assert plan.after == (Launch(KEY, 5, "reg_a/w1"),)


def test_other_sites_claim_an_open_step_and_book_a_worker():
    plan = decide(job(["reg_a", "reg_b"]), "reg_a", pool("reg_a/w1"))
    assert plan.action == "claim"
    s = plan.doc["job"][0]
    assert (s["claimed_by"], s["winner"], s["epoch"], s["step_status"]) == ("reg_a", None, 0, None)
    assert events(plan.doc) == ["created", "claimed"]
    assert plan.before == (Book(KEY, "reg_a/w1"),) and plan.after == ()


def test_a_claim_reuses_the_worker_already_booked_for_the_step():
    doc = step(job(), epoch=2)  # released after an earlier claim of ours
    plan = decide(doc, "reg_a", pool("reg_a/w2", booked={KEY: Booking("reg_a/w1", 3.0)}))
    assert plan.action == "claim" and plan.before == (Book(KEY, "reg_a/w1"),)


# --- decide: a claimed step ------------------------------------------------------------

def test_creator_assigns_a_claimed_step_with_a_new_epoch():
    plan = decide(claimed(job(), "reg_a"), CREATOR, pool("global/w1"))
    assert plan.action == "assign" and plan.detail == "winner reg_a"
    s = plan.doc["job"][0]
    assert (s["winner"], s["claimed_by"], s["epoch"], s["step_status"]) == (
        "reg_a", "reg_a", 1, None)
    assert plan.doc["history"][-1]["event"] == "won" and plan.doc["history"][-1]["epoch"] == 1
    assert plan.before == plan.after == ()


@pytest.mark.parametrize("site", ["reg_a", "reg_b"])
def test_non_creators_wait_on_a_claimed_step(site):
    the_pool = pool(f"{site}/w2", booked={KEY: Booking(f"{site}/w1", 1.0)})
    assert decide(claimed(job(), "reg_a"), site, the_pool) == core.NOTHING


# --- decide: a won step -----------------------------------------------------------------

def test_winner_starts_with_its_booked_worker_in_the_same_epoch():
    the_pool = pool("reg_a/w2", booked={KEY: Booking("reg_a/w1", 2.0)})
    plan = decide(won(job(), "reg_a", epoch=3), "reg_a", the_pool)
    assert plan.action == "start"
    s = plan.doc["job"][0]
    assert (s["epoch"], s["winner"], s["step_status"], s["executioner"]) == (
        3, "reg_a", "running", "reg_a/w1")
    assert plan.before == (Book(KEY, "reg_a/w1"),)
    assert plan.after == (Launch(KEY, 3, "reg_a/w1"),)


def test_winner_starts_with_a_free_worker():
    plan = decide(won(job(), "reg_a"), "reg_a", pool("reg_a/w2"))
    assert plan.action == "start" and plan.after == (Launch(KEY, 1, "reg_a/w2"),)


def test_winner_without_a_worker_takes_the_oldest_undecided_booking():
    booked = {("job-x", 0): Booking("reg_a/w1", 5.0), ("job-y", 1): Booking("reg_a/w2", 9.0)}
    plan = decide(won(job(), "reg_a"), "reg_a", pool(booked=booked))
    assert plan.action == "start"
    assert plan.before == (Unbook(("job-y", 1)), Book(KEY, "reg_a/w2"))
    assert plan.after == (Launch(KEY, 1, "reg_a/w2"),)
    assert plan.detail == "won the claim; worker taken from the claim on job-y step 1"
    assert plan.reason == Reason.WON_CLAIM


def test_only_a_start_on_a_win_says_it_won_the_claim():
    assert decide(won(job(), "reg_a"), "reg_a", pool("reg_a/w2")).reason == Reason.WON_CLAIM
    assert decide(job(), CREATOR, pool("global/w1")).reason is None  # it assigned itself


def test_winner_with_no_worker_at_all_releases_with_a_new_epoch():
    plan = decide(won(job(), "reg_a", epoch=1), "reg_a", pool())
    assert plan.action == "release"
    s = plan.doc["job"][0]
    assert (s["epoch"], s["claimed_by"], s["winner"], s["step_status"]) == (2, None, None, None)
    last = plan.doc["history"][-1]
    assert (last["event"], last["epoch"], last["detail"]) == (
        "released", 2, "won but no worker is free")


def test_a_win_no_worker_is_free_for_is_queued_within_the_queue_limit():
    other = ("job-x", 0)
    queued = decide(won(job(), "reg_a"), "reg_a", PoolView(queue_limit=1))
    assert (queued.action, queued.doc, queued.before) == (Action.QUEUE, None,
                                                          (core.Queue(KEY),))
    # Queued already: queued again (the limit counts the others), until half the lease.
    again = PoolView(queued={KEY: 29.0, other: 1.0}, queue_limit=2)
    assert decide(won(job(), "reg_a"), "reg_a", again).action == Action.QUEUE
    full = decide(won(job(), "reg_a"), "reg_a", PoolView(queued={other: 1.0}, queue_limit=1))
    assert (full.reason, full.doc["history"][-1]["reason"]) == (Reason.QUEUE_FULL, "queue_full")
    late = PoolView(queued={KEY: 30.0}, queue_limit=1)  # ctx's lease: 60 s
    assert decide(won(job(), "reg_a"), "reg_a", late).doc["history"][-1]["reason"] == \
        Reason.NO_WORKER_IN_TIME
    # A worker free: it starts, queued or not.
    free = PoolView(("reg_a/w1",), queued={KEY: 10.0}, queue_limit=1)
    assert decide(won(job(), "reg_a"), "reg_a", free).action == "start"


def test_a_win_queued_across_a_restart_goes_back_by_its_own_times():
    """Our count of how long we queue a win restarts with the daemon; its `won` event and
    its start-by lease (the creator's clock) do not."""
    doc = logged(step(won(job(), "reg_a"), lease_until=at(560)), "won", CREATOR, 500,
                 epoch=1, detail="winner reg_a (it has room)")
    fresh = PoolView(queue_limit=1)  # just restarted: queued for 0 s by our count
    assert core.plan([doc], ctx("reg_a", now=at(529)), fresh).action == Action.QUEUE
    late = core.plan([doc], ctx("reg_a", now=at(530)), fresh)
    assert late.doc["history"][-1]["reason"] == Reason.NO_WORKER_IN_TIME
    # An older epoch's `won` says nothing of this one's times.
    doc["history"][-1]["epoch"] = 0
    assert core.plan([doc], ctx("reg_a", now=at(530)), fresh).action == Action.QUEUE



@pytest.mark.parametrize("booked", [False, True])
def test_a_win_that_reaches_us_past_its_start_by_lease_is_released_not_started(booked):
    """The creator may be revoking it right now: a start written beside that revocation
    runs the step in an epoch the merge overturns (seen in the storm, seed 749098)."""
    doc = step(won(job(), "reg_a", epoch=2), lease_until=at(560))
    bookings = {KEY: Booking("reg_a/w1", 40.0)} if booked else None
    the_pool = pool("reg_a/w2", booked=bookings)
    in_time = core.plan([json_copy(doc)], ctx("reg_a", now=at(559.9)), the_pool)
    assert in_time.action == "start"
    for now in (at(560), at(561.7)):
        lapsed = core.plan([json_copy(doc)], ctx("reg_a", now=now), the_pool)
        assert (lapsed.action, lapsed.after) == ("release", ())
        assert lapsed.before == ((Unbook(KEY),) if booked else ())
        s = lapsed.doc["job"][0]
        assert (s["epoch"], s["winner"], s["step_status"], s["lease_until"]) == (
            3, None, None, None)
        assert (lapsed.reason, lapsed.doc["history"][-1]["reason"]) == (
            Reason.WIN_LAPSED, "win_lapsed")
        validate_job(lapsed.doc)

@pytest.mark.parametrize("site", [CREATOR, "reg_b"])
def test_others_leave_a_won_step_alone(site):
    assert decide(won(job(), "reg_a"), site, pool(f"{site}/w1")) == core.NOTHING


# --- decide: a running step ----------------------------------------------------------------

def test_winner_without_the_execution_releases_a_running_step():
    plan = decide(running(job(), "reg_a"), "reg_a", pool("reg_a/w1"))
    assert plan.action == "release"
    s = plan.doc["job"][0]
    assert (s["epoch"], s["winner"], s["executioner"], s["step_status"], s["start_time"]) == (
        2, None, None, None, None)
    assert plan.doc["history"][-1]["detail"] == "worker lost (site restarted)"


def test_winner_with_the_execution_lets_a_running_step_run():
    the_pool = pool(running={KEY: Running("reg_a/w1", 1)})
    assert decide(running(job(), "reg_a"), "reg_a", the_pool) == core.NOTHING


@pytest.mark.parametrize("site", [CREATOR, "reg_b"])
def test_others_leave_a_running_step_alone(site):
    assert decide(running(job(), "reg_a"), site, pool(f"{site}/w1")) == core.NOTHING


# --- decide: targets nobody can run ----------------------------------------------------

def test_creator_fails_a_job_whose_target_no_known_site_matches():
    plan = decide(job(["reg_x", "reg_y"]), CREATOR, pool("global/w1"), known={CREATOR, "reg_a"})
    assert plan.action == "fail"
    assert plan.doc["job_status"] == "failed" and plan.doc["job"][0]["step_status"] == "failed"
    assert plan.doc["history"][-1]["event"] == "failed"
    assert "reg_x" in plan.doc["history"][-1]["detail"]


def test_unknown_targets_fail_only_at_the_creator_and_only_with_known_sites():
    doc = job(["reg_x"])
    assert decide(doc, CREATOR, pool("global/w1")).action == "none"  # no known_sites
    assert decide(doc, "reg_a", pool("reg_a/w1"), known={CREATOR}).action == "none"
    assert decide(job("any"), CREATOR, pool(), known={CREATOR}).action == "none"
    assert decide(job(["reg_x", "reg_a"]), CREATOR, pool(), known={"reg_a"}).action == "none"


@pytest.mark.parametrize(("site", "action"), [(CREATOR, "fail"), ("reg_a", "none")])
def test_a_live_job_whose_current_step_already_ended_is_failed_by_its_creator(site, action):
    doc = step(job("any", "any"), 0, step_status="finished", epoch=1, winner="reg_a")
    plan = decide(doc, site, pool(f"{site}/w1"))
    assert plan.action == action
    if action == "fail":
        assert plan.doc["job_status"] == "failed"


# --- decide: settling local work first --------------------------------------------------------

def test_an_execution_of_a_cancelled_job_is_killed():
    doc = running(job(), "reg_a")
    doc["job_status"] = "cancelled"
    plan = decide(doc, "reg_a", pool(running={KEY: Running("reg_a/w1", 1)}))
    assert (plan.action, plan.before, plan.doc) == ("kill", (Kill(KEY, "job cancelled"),), None)


def test_an_execution_of_a_superseded_epoch_is_killed():
    doc = running(job(), "reg_a", epoch=3)
    plan = decide(doc, "reg_a", pool(running={KEY: Running("reg_a/w1", 2)}))
    assert plan.action == "kill" and plan.before == (Kill(KEY, "execution superseded"),)
    # the same epoch, but the document says another site won it
    plan = decide(running(job(), "reg_b", epoch=2), "reg_a",
                  pool(running={KEY: Running("reg_a/w1", 2)}))
    assert plan.before == (Kill(KEY, "execution superseded"),)


def test_an_execution_of_a_step_the_job_moved_past_is_killed():
    doc = step(won(job("any", "any"), "reg_a"), step_status="finished")
    doc["step"] = 1
    running(doc, "reg_b")
    plan = decide(doc, "reg_a", pool(running={KEY: Running("reg_a/w1", 1)}))
    assert plan.before == (Kill(KEY, "execution superseded"),)


def test_local_work_for_other_jobs_is_not_touched():
    the_pool = pool(booked={("job-x", 0): Booking("reg_a/w1", 999.0)},
                    running={("job-y", 0): Running("reg_a/w2", 1)})
    assert decide(claimed(job(), "reg_b"), "reg_a", the_pool) == core.NOTHING


def test_a_booking_is_freed_when_the_step_advanced_or_the_job_ended():
    advanced = step(won(job("any", "any"), "reg_b"), 0, step_status="finished")
    advanced["step"] = 1
    old = pool(booked={KEY: Booking("reg_a/w1", 1.0)})
    plan = decide(advanced, "reg_a", old)
    assert (plan.action, plan.before, plan.doc) == ("free", (Unbook(KEY),), None)
    ended = job()
    ended["job_status"] = "cancelled"
    assert decide(ended, "reg_a", old).before == (Unbook(KEY),)


@pytest.mark.parametrize("phase", [won, running])
def test_a_booking_is_freed_once_another_site_won(phase):
    plan = decide(phase(job(), "reg_b"), "reg_a", pool(booked={KEY: Booking("reg_a/w1", 1.0)}))
    assert plan.action == "free" and plan.before == (Unbook(KEY),)


def test_a_booking_waits_for_the_creator_until_the_booking_timeout():
    doc = claimed(job(), "reg_b")  # our claim lost the hash, the creator has not decided
    young = pool(booked={KEY: Booking("reg_a/w1", 59.0)})
    old = pool(booked={KEY: Booking("reg_a/w1", 60.0)})
    assert decide(doc, "reg_a", young) == core.NOTHING
    assert decide(doc, "reg_a", old).before == (Unbook(KEY),)
    assert decide(doc, "reg_a", old, timeout=61.0) == core.NOTHING


def test_a_booking_for_a_later_step_is_kept_no_longer_than_the_booking_timeout():
    """We claimed step 1; the job is at step 0 again: an old view, or a revocation of
    step 0 (a higher epoch) outranked the branch where we claimed. Step 0, for us
    alone, needs this very worker: kept for ever, the job would never end (found by
    test_core_sim)."""
    back = step(job("reg_a", "any"), 0, epoch=2)  # released: lease of reg_a expired
    later = (JOB, 1)
    young = pool(booked={later: Booking("reg_a/w1", 59.0)})
    assert decide(back, "reg_a", young) == core.NOTHING
    old = pool(booked={later: Booking("reg_a/w1", 60.0)})
    plan = decide(back, "reg_a", old)
    assert (plan.action, plan.before, plan.doc) == ("free", (Unbook(later),), None)
    # Freed, the worker starts step 0 (its sole target) in the next decision.
    assert decide(back, "reg_a", pool("reg_a/w1")).action == "start"


# --- finishing an execution --------------------------------------------------------------------

def finish(doc: Doc | list[Doc], site: str = "reg_a", the_pool: PoolView | None = None, *,
           epoch: int = 1, **outcome: Any) -> Plan:
    """The plan of `site` when its execution of step 0 in `epoch` (on worker w1) ends."""
    leaves = doc if isinstance(doc, list) else [doc]
    return core.plan_finish(leaves, ctx(site), the_pool or pool(), KEY, epoch,
                            f"{site}/w1", Outcome(**outcome))


@pytest.mark.parametrize(("ok", "used_alt", "reason"), [
    (True, True, Reason.ALT_DO), (True, False, None), (False, True, None)])
def test_a_step_its_alt_do_saved_says_so_by_its_reason_code(ok, used_alt, reason):
    plan = finish(running(job(), "reg_a"), "reg_a", ok=ok, used_alt=used_alt)
    assert (plan.reason, plan.doc["history"][-1].get("reason")) == (reason, reason)
    validate_job(plan.doc)


def test_success_advances_and_chains_the_next_step_here_in_the_same_revision():
    doc = step(running(job("any", "reg_a", "any"), "reg_a"), 1, epoch=3)
    plan = finish(doc, "reg_a", pool("reg_a/w1"), exec_time=1.23456789, stdout="hi")
    assert plan.action == "finish" and plan.detail == "exit 0"
    first, second = plan.doc["job"][0], plan.doc["job"][1]
    assert plan.doc["step"] == 1 and plan.doc["job_status"] is None
    assert (first["step_status"], first["exit_code"], first["exec_time"], first["attempts"]) == (
        "finished", 0, 1.234568, 1)
    assert first["output"] == {"stdout": "hi", "stderr": ""}
    assert (second["epoch"], second["winner"], second["step_status"]) == (4, "reg_a", "running")
    assert events(plan.doc)[-2:] == ["finished", "started"]
    assert plan.before == (Book((JOB, 1), "reg_a/w1"),)
    assert plan.after == (Launch((JOB, 1), 4, "reg_a/w1"),)
    assert plan.doc["updated_at"] == NOW


@pytest.mark.parametrize("target, free", [("reg_b", ("reg_a/w1",)), ("any", ())])
def test_success_does_not_chain_when_not_targeted_or_without_a_worker(target, free):
    plan = finish(running(job("any", target), "reg_a"), "reg_a", pool(*free))
    assert plan.action == "finish" and plan.doc["step"] == 1
    assert plan.doc["job"][1]["step_status"] is None and plan.doc["job"][1]["epoch"] == 0
    assert plan.before == plan.after == ()


def test_success_of_the_last_step_ends_the_job():
    plan = finish(running(job(), "reg_a"), "reg_a", pool("reg_a/w1"))
    assert plan.doc["job_status"] == "success" and plan.doc["step"] == 1
    assert not is_live(plan.doc) and plan.before == plan.after == ()


def test_failure_fails_the_job_at_its_step():
    plan = finish(running(job("any", "any"), "reg_a"), "reg_a", pool("reg_a/w1"),
                  ok=False, exit_code=3, reason="exit 3", attempts=2)
    assert plan.action == "finish"
    assert plan.doc["job_status"] == "failed" and plan.doc["step"] == 0
    s = plan.doc["job"][0]
    assert (s["step_status"], s["exit_code"], s["attempts"]) == ("failed", 3, 2)
    assert plan.doc["history"][-1]["event"] == "failed" and plan.after == ()


def test_a_kill_of_a_cancelled_job_is_noted_and_does_not_advance():
    doc = running(job("any", "any"), "reg_a")
    doc["job_status"] = "cancelled"
    plan = finish(doc, "reg_a", pool("reg_a/w1"), cancelled=True, ok=False, reason="killed")
    assert plan.action == "cancelled"
    # The step says how its run ended (not "running" for ever); the job does not move.
    step = plan.doc["job"][0]
    assert plan.doc["step"] == 0 and plan.doc["job_status"] == "cancelled"
    assert (step["step_status"], step["lease_until"]) == ("failed", None)
    assert step["finish_time"] is not None
    last = plan.doc["history"][-1]
    assert (last["event"], last["epoch"], last["worker"], last["detail"]) == (
        "cancelled", 1, "reg_a/w1", "killed: job cancelled")
    assert plan.before == plan.after == ()
    # A kill of a run the step no longer backs (an older epoch) only leaves its event.
    stale = finish(doc, "reg_a", pool("reg_a/w1"), epoch=0, cancelled=True, ok=False)
    assert stale.doc["job"][0]["step_status"] == "running"
    assert stale.doc["history"][-1]["event"] == "cancelled"


def test_a_current_execution_stopped_here_releases_the_step():
    plan = finish(running(job(), "reg_a"), "reg_a", pool("reg_a/w1"),
                  cancelled=True, ok=False, reason="shutdown")
    assert plan.action == "release"
    assert plan.doc["job"][0]["epoch"] == 2 and plan.doc["job"][0]["winner"] is None
    assert plan.doc["history"][-1]["detail"] == "stopped on this site: shutdown"


@pytest.mark.parametrize("superseded", ["epoch", "winner", "step"])
def test_a_stale_finish_is_noted_and_never_advances(superseded):
    doc = running(job("any", "any"), "reg_a", epoch=2)
    epoch = 2
    if superseded == "epoch":
        epoch = 1
    elif superseded == "winner":
        doc = running(doc, "reg_b", epoch=2)
    else:  # step 0 finished (by a later epoch) and the job moved on
        step(doc, step_status="finished", epoch=3)
        doc["step"] = 1
        running(doc, "reg_b")
    before = copy.deepcopy(doc)
    plan = finish(doc, "reg_a", pool("reg_a/w1"), epoch=epoch, reason="exit 0")
    assert plan.action == "stale_finish"
    assert plan.doc["job"] == before["job"] and plan.doc["step"] == before["step"]
    assert plan.doc["job_status"] is None and plan.after == ()
    last = plan.doc["history"][-1]
    assert (last["event"], last["step"], last["epoch"]) == ("stale_finish", 0, epoch)
    assert last["detail"] == f"epoch {epoch} is no longer current: exit 0"


def test_a_finish_on_a_conflicted_doc_is_also_a_cleanup_at_the_creator():
    current_run = running(job(rev="4-aaa", creator="reg_a"), "reg_a")
    stale = claimed(job(rev="4-fff", creator="reg_a"), "reg_b")
    plan = finish([current_run, stale], "reg_a", pool("reg_a/w1"))
    assert plan.action == "finish" and plan.deletions == ("4-aaa",)
    assert plan.doc["_rev"] == "4-fff" and plan.doc["job_status"] == "success"


def test_plan_retried_notes_a_current_execution_in_the_history():
    doc = running(job(), "reg_a", epoch=2)
    plan = core.plan_retried([doc], ctx("reg_a"), KEY, 2, "reg_a/w1", "attempt 2")
    assert plan.action == "retried" and plan.doc["job"] == doc["job"]
    last = plan.doc["history"][-1]
    assert (last["event"], last["epoch"], last["worker"], last["detail"]) == (
        "retried", 2, "reg_a/w1", "attempt 2")
    assert plan.doc["updated_at"] == NOW


def test_plan_retried_ignores_a_stale_execution():
    doc = running(job(), "reg_a", epoch=3)
    assert core.plan_retried([doc], ctx("reg_a"), KEY, 2, "reg_a/w1", "x") is core.NOTHING


# --- a start launched ahead of its write (docs/protocol.md, "Launch ahead") --------------

def ahead(site: str, epoch: int = 1) -> PoolView:
    """A pool running step 0 on w1, launched ahead of a start whose write was lost."""
    run = Running(f"{site}/w1", epoch)
    return PoolView((f"{site}/w2",), running={KEY: run}, ahead={KEY: run})


def test_a_winner_writes_a_lost_start_again_on_a_newer_revision_of_its_win():
    doc = logged(won(job(rev="4-b"), "reg_a"), "keepalive", CREATOR, 20)  # came in between
    plan = decide(doc, "reg_a", ahead("reg_a"))
    assert (plan.action, plan.reason) == (Action.START, Reason.LATE_START)
    assert plan.before == () and plan.after == ()  # it runs already: nothing to book or launch
    assert current(plan.doc)["step_status"] == "running"
    assert current(plan.doc)["epoch"] == 1 and current(plan.doc)["executioner"] == "reg_a/w1"


def test_no_start_of_a_run_launched_ahead_is_written_past_its_wins_start_by_lease():
    """The creator may be revoking it (win_lapsed): the start alone, a note, or the
    record of its end never puts it on the document as started."""
    lapsed = step(won(job("any", "any"), "reg_a"), lease_until=at(590))  # NOW is at(600)
    in_time = step(won(job("any", "any"), "reg_a"), lease_until=at(700))
    assert decide(copy.deepcopy(lapsed), "reg_a", ahead("reg_a")).reason != Reason.LATE_START
    assert decide(copy.deepcopy(in_time), "reg_a", ahead("reg_a")).reason == Reason.LATE_START
    noted = [core.plan_retried([copy.deepcopy(doc)], ctx("reg_a"), KEY, 1, "reg_a/w1",
                               "exit 1; retry 1 of 2", Running("reg_a/w1", 1, at(580)))
             for doc in (lapsed, in_time)]
    assert noted[0] is core.NOTHING
    assert events(noted[1].doc)[-2:] == ["started", "retried"]
    assert current(noted[1].doc)["start_time"] == at(580)  # the launch's time
    # Its end: recorded as run, the step given back in a new epoch, nothing chained.
    ended = finish(lapsed, "reg_a", pool("reg_a/w1"), start_time=at(585))
    assert (ended.action, ended.after) == ("release", ())
    assert events(ended.doc)[-2:] == ["started", "released"]
    assert ended.doc["step"] == 0 and current(ended.doc)["epoch"] == 2
    assert ended.doc["history"][-2]["at"] == at(585)
    assert (ended.reason, ended.doc["history"][-1]["reason"]) == (
        Reason.START_LAPSED, "start_lapsed")


def test_a_lease_is_renewed_only_on_a_start_that_is_written():
    won_only = step(won(job(), "reg_a"), lease_until=at(610))
    assert core.plan_renew([won_only], ctx("reg_a"), KEY, 1, renew_below=50.0) is core.NOTHING
    started = step(running(job(), "reg_a"), lease_until=at(610))
    assert core.plan_renew([started], ctx("reg_a"), KEY, 1, renew_below=50.0).action == "renew"


def test_a_creator_writes_its_lost_start_over_a_claim_that_came_in_between():
    doc = claimed(job(rev="2-c"), "reg_b")
    plan = decide(doc, CREATOR, ahead(CREATOR))
    assert (plan.action, plan.reason, plan.after) == (Action.START, Reason.LATE_START, ())
    assert current(plan.doc)["winner"] == CREATOR and current(plan.doc)["epoch"] == 1
    # Not the creator, nor the only target: its launch ahead is never recorded so.
    assert decide(copy.deepcopy(doc), "reg_a", ahead("reg_a")).reason != Reason.LATE_START


def after_first_step(ended_by: str, epoch: int, finish: float) -> Doc:
    """A job whose first step ended (a run of `ended_by` in `epoch`), its second step
    open to reg_a alone."""
    doc = step(job("any", "reg_a"), 0, step_status="finished", claimed_by=ended_by,
               winner=ended_by, epoch=epoch, executioner=f"{ended_by}/w1",
               start_time=at(finish - 10), finish_time=at(finish))
    doc["step"] = 1
    return doc


def test_a_run_launched_after_a_step_end_that_no_longer_counts_is_never_started_late():
    """The storm's case: reg_a, only target of step 1, launched it ahead once step 0's
    end arrived, and its server died before the start was written. Meanwhile the
    creator, which never saw that end, revoked step 0 and ran it again: merged, the
    job shows step 1 open in the very epoch reg_a's run was launched in, after a run of
    step 0 that ended after reg_a's run began. That run is a stale finish (its epoch
    burned), never a start and an end written late; one that followed the end that
    counts still is, and so is one whose launch says nothing of what it followed."""
    seen_then, now = after_first_step("reg_b", 1, 100), after_first_step(CREATOR, 3, 200)
    assert core.follows(seen_then, 1) == at(100) and core.follows(now, 1) == at(200)
    assert core.follows(now, 0) is None

    def end(after: str | None) -> Plan:
        return core.plan_finish([copy.deepcopy(now)], ctx("reg_a"), pool("reg_a/w1"),
                                (JOB, 1), 1, "reg_a/w1", Outcome(start_time=at(150)),
                                after=after)
    stale = end(after=at(100))
    assert stale.action == "stale_finish" and "started" not in events(stale.doc)[-2:]
    assert current(stale.doc)["epoch"] == 1 and current(stale.doc)["step_status"] is None
    for after in (at(200), None):
        counted = end(after)
        assert counted.action == "finish" and events(counted.doc)[-2:] == ["started",
                                                                           "finished"]
    # The creator, which never saw that run, may give step 1 to reg_a in that very
    # epoch: the run is still stale, and the win, its token used, is given back.
    rewon = step(copy.deepcopy(now), 1, claimed_by="reg_a", winner="reg_a", epoch=1,
                 lease_until=at(10_000))
    stale = core.plan_finish([rewon], ctx("reg_a"), pool("reg_a/w1"), (JOB, 1), 1,
                             "reg_a/w1", Outcome(start_time=at(150)), after=at(100))
    assert stale.action == "stale_finish" and stale.doc["job_status"] is None
    assert current(stale.doc)["winner"] == "reg_a" and current(stale.doc)["epoch"] == 1
    again = decide(stale.doc, "reg_a", pool("reg_a/w1"))
    assert again.action == "release" and current(again.doc)["epoch"] > 1
    # Nor is its start written alone, or with a note, on the document as it is now.
    launched = Running("reg_a/w1", 1, at(150), after=at(100))
    view = PoolView(("reg_a/w2",), running={(JOB, 1): launched}, ahead={(JOB, 1): launched})
    assert decide(copy.deepcopy(now), "reg_a", view).reason != Reason.LATE_START
    assert core.plan_retried([copy.deepcopy(now)], ctx("reg_a"), (JOB, 1), 1, "reg_a/w1",
                             "attempt 2", launched) is core.NOTHING


def test_a_lost_start_is_not_written_where_the_job_moved_on():
    moved = [won(job(), "reg_b"),                      # the creator chose another site
             won(job(), "reg_a", epoch=2),             # a newer epoch of ours: not this run
             running(job(), "reg_a"),                  # recorded already
             step(job(), job_status="cancelled")]      # cancelled meanwhile
    moved[3]["job_status"] = "cancelled"
    for doc in moved:
        assert decide(doc, "reg_a", ahead("reg_a")).reason != Reason.LATE_START, doc["job"][0]
    # Where it moved past the run, the run is stopped.
    assert decide(moved[0], "reg_a", ahead("reg_a")).before == (Kill(KEY, "execution superseded"),)


def test_a_run_whose_start_was_never_written_records_start_and_end_in_one_revision():
    plan = finish(won(job("any", "any"), "reg_a"), "reg_a", pool("reg_a/w1"),
                  start_time=at(30), finish_time=at(31))
    assert plan.action == "finish"
    done = plan.doc["job"][0]
    assert done["step_status"] == "finished" and done["executioner"] == "reg_a/w1"
    assert done["start_time"] == at(30)  # the run's own start, not the time of the write
    # Its start, its end, and the next step chained here, as after any finish.
    assert events(plan.doc) == ["created", "started", "finished", "started"]
    assert plan.after == (Launch((JOB, 1), 1, "reg_a/w1"),)
    # The creator's own run of an open step: started in the next epoch, then ended.
    own = core.plan_finish([job()], ctx(CREATOR), pool(), KEY, 1, f"{CREATOR}/w1", Outcome())
    assert own.action == "finish" and own.doc["job_status"] == "success"
    assert own.doc["job"][0]["epoch"] == 1 and own.doc["job"][0]["winner"] == CREATOR


def test_a_lost_start_of_a_step_given_elsewhere_is_a_stale_finish():
    plan = finish(won(job(), "reg_b"), "reg_a", pool("reg_a/w1"))
    assert plan.action == "stale_finish"


def test_a_run_of_ours_the_revision_does_not_show_waits_for_its_report():
    """Launched ahead and stopped, its report not recorded yet: starting the step again
    now would give two runs one epoch."""
    stopped = PoolView((f"{CREATOR}/w2",), running={KEY: Running(f"{CREATOR}/w1", 1)})
    assert decide(job(), CREATOR, stopped).action == "none"
    assert decide(won(job(), "reg_a"), "reg_a", PoolView(
        ("reg_a/w2",), running={KEY: Running("reg_a/w1", 1)})).action == "none"


def test_which_starts_launch_ahead():
    assert decide(job(), CREATOR, pool(f"{CREATOR}/w1")).after[0].ahead  # ours: no one revokes
    fresh = step(won(job(), "reg_a"), lease_until=at(600 + 60))
    assert decide(fresh, "reg_a", pool("reg_a/w1")).after[0].ahead
    old = step(won(job(), "reg_a"), lease_until=at(600 + 20))  # under half the lease left
    assert not decide(old, "reg_a", pool("reg_a/w1")).after[0].ahead
    chained = finish(step(running(job("any", "any"), "reg_a"), 1, epoch=3), "reg_a",
                     pool("reg_a/w1"))
    assert chained.after == (Launch((JOB, 1), 4, "reg_a/w1"),)
    assert not chained.after[0].ahead  # its end's write may be lost: launched once written


def test_a_stale_run_no_revision_showed_started_burns_its_epoch():
    """A run launched ahead after an end that turned out stale never had its start
    written: its stale finish moves the step's epoch up to the run's, so no later start
    here reuses it."""
    revoked = step(job("any", "any"), 0, epoch=2)  # step 0 revoked from us: open again
    plan = core.plan_finish([revoked], ctx("reg_a"), pool("reg_a/w1"), (JOB, 1), 1,
                            "reg_a/w1", Outcome(cancelled=True, ok=False))
    assert plan.action == "stale_finish" and plan.doc["job"][1]["epoch"] == 1
    assert plan.doc["step"] == 0 and plan.doc["job"][0]["epoch"] == 2
    # The current step, still to start: the same.
    moved = step(revoked, 0, step_status="finished", winner="reg_b")
    moved["step"] = 1
    again = core.plan_finish([moved], ctx("reg_a"), pool("reg_a/w1"), (JOB, 1), 1,
                             "reg_a/w1", Outcome(cancelled=True, ok=False))
    assert again.action == "stale_finish" and again.doc["job"][1]["epoch"] == 1
    # Not a step that is won (its epoch is the winner's), nor an epoch already past.
    given = won(copy.deepcopy(moved), "reg_b", epoch=1)
    kept = core.plan_finish([given], ctx("reg_a"), pool(), (JOB, 1), 2, "reg_a/w1",
                            Outcome()).doc["job"][1]
    assert (kept["winner"], kept["epoch"]) == ("reg_b", 1)
    past = step(copy.deepcopy(moved), 1, epoch=3)
    assert core.plan_finish([past], ctx("reg_a"), pool(), (JOB, 1), 1, "reg_a/w1",
                            Outcome()).doc["job"][1]["epoch"] == 3


def test_records_start_names_one_job_one_execution():
    doc = running(job(), "reg_a")
    assert core.records_start(doc, KEY, 1, "reg_a")
    assert not core.records_start(doc, ("job-2", 0), 1, "reg_a")
    assert not core.records_start(doc, KEY, 2, "reg_a")
    assert not core.records_start(won(job(), "reg_a"), KEY, 1, "reg_a")
    assert not core.records_start(None, KEY, 1, "reg_a")


# --- a site's command allow-list ----------------------------------------------------------

def only_echo(command: str) -> bool:
    return command.startswith("echo ")


def test_a_site_does_not_take_a_step_it_would_refuse_another_site_may_run():
    doc = job("any")
    doc["job"][0]["do"] = "rm -rf /srv"
    plan = core.plan([doc], Context("reg_a", NOW, runs=only_echo), pool("reg_a/w1"))
    assert plan.action == Action.IGNORE and plan.doc is None and plan.before == ()
    # ... nor as the creator, which would start it at once
    plan = core.plan([doc], Context(CREATOR, NOW, runs=only_echo), pool("global/w1"))
    assert plan.action == Action.IGNORE
    # An allowed command, or no list at all: taken as ever.
    assert core.plan([job("any")], Context("reg_a", NOW, runs=only_echo),
                     pool("reg_a/w1")).action == "claim"
    assert core.plan([doc], Context("reg_a", NOW), pool("reg_a/w1")).action == "claim"


def test_the_only_target_takes_a_refused_step_so_that_it_fails_with_the_reason():
    doc = job("reg_a")
    doc["job"][0]["do"] = "rm -rf /srv"
    plan = core.plan([doc], Context("reg_a", NOW, runs=only_echo), pool("reg_a/w1"))
    assert plan.action == "start"


def test_a_refused_next_step_is_not_chained():
    doc = running(job("any", "any"), "reg_a")
    doc["job"][1]["do"] = "rm -rf /srv"
    plan = core.plan_finish([doc], Context("reg_a", NOW, runs=only_echo), pool("reg_a/w1"),
                            KEY, 1, "reg_a/w1", Outcome())
    assert plan.action == "finish" and plan.doc["job"][1]["step_status"] is None
    assert plan.after == ()


# --- keep-alive ----------------------------------------------------------------------------------

def test_keepalive_resaves_a_stale_open_job_changing_only_keepalive_at():
    doc = job(rev="3-a")
    touched = core.keepalive([doc], ctx(CREATOR, now=at(100)), stale_after=100)
    assert touched is not None and touched["keepalive_at"] == at(100)
    assert {k: v for k, v in touched.items() if k != "keepalive_at"} == doc
    assert "keepalive_at" not in doc


def test_a_job_of_a_newer_format_is_neither_kept_alive_merged_nor_cleaned():
    """Its rules are a later release's: no leaf of it is usable, none is rejected (the
    creator would delete a rejected leaf), and nobody re-saves it."""
    newer = {**job(rev="3-a"), "format": JOB_FORMAT + 1}
    assert core.keepalive([newer], ctx(CREATOR, now=at(100)), stale_after=100) is None
    ours = job(rev="3-b")
    assert core.usable_leaves([ours, newer]) == ([], [])
    assert core.usable_leaves([ours])[0] == [ours]


def test_keepalive_waits_for_the_threshold_since_the_last_update_or_keepalive():
    doc = job()
    doc["updated_at"] = at(50)
    assert core.keepalive([doc], ctx(now=at(149)), stale_after=100) is None
    assert core.keepalive([doc], ctx(now=at(150)), stale_after=100) is not None
    doc["keepalive_at"] = at(120)
    assert core.keepalive([doc], ctx(now=at(219)), stale_after=100) is None
    assert core.keepalive([doc], ctx(now=at(220)), stale_after=100)["keepalive_at"] == at(220)


@pytest.mark.parametrize("case", ["not creator", "ended", "claimed", "won", "running",
                                  "conflicted", "no leaves"])
def test_keepalive_only_for_the_creator_of_a_live_open_unconflicted_job(case):
    doc, site, leaves = job(), CREATOR, None
    if case == "not creator":
        site = "reg_a"
    elif case == "ended":
        doc["job_status"] = "cancelled"
    elif case == "claimed":
        claimed(doc, "reg_a")
    elif case == "won":
        won(doc, "reg_a")
    elif case == "running":
        running(doc, "reg_a")
    elif case == "conflicted":
        leaves = [doc, job(rev="1-b")]
    elif case == "no leaves":
        leaves = []
    result = core.keepalive([doc] if leaves is None else leaves, ctx(site, now=at(10_000)), 1.0)
    assert result is None


def test_resave_picks_as_many_stale_jobs_as_there_is_room_in_line_order():
    stale = [("j1", "any"), ("j2", "any"), ("j3", "any"), ("j4", "any")]
    assert core.resave_picks(stale, {"global": 0, "reg_a": 2, "reg_b": 0}) == ["j1", "j2"]
    assert core.resave_picks(stale, {"global": 1, "reg_a": 0, "reg_b": 1}) == ["j1", "j2"]
    # A burst's line: every site busy, nobody to remind.
    assert core.resave_picks(stale, {"global": 0, "reg_a": -1, "reg_b": 0}) == []


def test_resave_picks_only_for_a_site_the_step_allows():
    stale = [("for_b", "reg_b"), ("for_a", ["reg_a", "global"]), ("any", "any")]
    assert core.resave_picks(stale, {"global": 0, "reg_a": 3, "reg_b": 0}) == ["for_a", "any"]
    # The site with the most room is charged, so a later job bound to the other still fits.
    stale = [("any", "any"), ("for_b", "reg_b")]
    assert core.resave_picks(stale, {"reg_a": 2, "reg_b": 1}) == ["any", "for_b"]


def test_resave_picks_counts_a_site_of_unknown_room_as_unknown_room():
    stale = [(f"j{i}", "reg_a") for i in range(core.UNKNOWN_ROOM + 5)]
    picks = core.resave_picks(stale, {"global": 0, "reg_a": None})
    assert picks == [f"j{i}" for i in range(core.UNKNOWN_ROOM)]


def test_resave_picks_passes_a_malformed_target_by():
    stale = [("none", None), ("empty", []), ("number", 3), ("mixed", ["reg_a", 1]),
             ("good", "reg_a")]
    assert core.resave_picks(stale, {"reg_a": 9}) == ["good"]


# --- adoption: a creator gone for good --------------------------------------------------------

def adopt(leaves: list[Doc], site: str = "reg_a", gone: str = CREATOR) -> Plan:
    return core.plan_adopt(leaves, ctx(site), gone, "global burned down")


def test_adoption_makes_this_site_the_creator_and_records_the_term():
    plan = adopt([claimed(job(), "reg_b")])
    assert plan.action == "adopt" and plan.doc is not None
    assert plan.doc["creator"] == "reg_a"
    adopted = plan.doc["history"][-1]
    assert (adopted["event"], adopted["site"], adopted["epoch"]) == ("adopted", "reg_a", 1)
    assert adopted["detail"] == "creator global -> reg_a: global burned down"
    assert plan.doc["job"][0]["claimed_by"] == "reg_b"  # the claim waits for the new creator
    # ... which now decides it, while the gone creator no longer would.
    assert decide(plan.doc, "reg_a").action == "assign"
    assert decide(plan.doc, CREATOR).action == "none"


def test_adoption_is_only_for_live_jobs_of_the_gone_creator():
    done = job()
    done["job_status"] = "success"
    assert adopt([]).action == "none"
    assert adopt([done]).action == "none"
    assert adopt([job(creator="reg_b")]).action == "none"
    assert adopt([job()], site=CREATOR).action == "none"


def test_adoption_cleans_a_job_that_ended_while_its_winning_revision_shows_it_live():
    """global revoked reg_a's lease while reg_a's run ended the job on its branch, and
    re-saved the reopened step; global died before it saw reg_a's branch. Its branch,
    longer, is CouchDB's winner and live: every view shows the job live, and only a
    creator cleans. The operator's adoption takes it and cleans (found by
    test_core_sim's dead-site simulation)."""
    ended = running(job(rev="3-a"), "reg_a")
    step(ended, step_status="finished")
    ended.update(step=1, job_status="success")
    reopened = step(job(rev="4-f"), epoch=2, keepalive_at=at(40))  # released, re-saved
    assert core.merge([ended, reopened])["job_status"] == "success"

    plan = adopt([ended, reopened], site="reg_b")
    assert plan.action == "adopt" and plan.doc is not None
    assert plan.doc["_rev"] == "4-f" and plan.deletions == ("3-a",)
    assert (plan.doc["job_status"], plan.doc["creator"]) == ("success", "reg_b")
    adopted = plan.doc["history"][-1]
    assert (adopted["event"], adopted["site"], adopted["epoch"]) == ("adopted", "reg_b", 1)
    assert adopted["detail"].endswith("global burned down (the job ended, but its winning "
                                      "revision still shows it live)")
    # Nothing to do when the ended leaf is the winner: every view shows the job ended.
    ended["_rev"] = "5-a"
    assert adopt([ended, reopened], site="reg_b") == core.NOTHING


def test_merge_keeps_the_adopter_against_late_writes_of_the_gone_creator():
    adopted = adopt([job()]).doc
    assert adopted is not None
    adopted["_rev"] = "2-a"
    late = running(job(rev="3-f"), "reg_b")  # further along, and still names global
    merged = core.merge([adopted, late])
    assert merged["creator"] == "reg_a"
    assert merged["job"][0]["winner"] == "reg_b"


def test_a_second_adoption_takes_a_higher_term():
    first = adopt([job()]).doc
    assert first is not None
    second = core.plan_adopt([first], ctx("reg_b"), "reg_a", "reg_a too").doc
    assert second is not None
    assert [e["epoch"] for e in second["history"] if e["event"] == "adopted"] == [1, 2]
    second["_rev"], first["_rev"] = "3-a", "2-f"
    assert core.merge([first, second])["creator"] == "reg_b"


# --- automatic succession: a silent creator's jobs taken over ------------------------------

LINE = {CREATOR: ("reg_a", "reg_b")}


def succession_plan(doc: Doc, site: str, silent: set[str]) -> Plan:
    context = dataclasses.replace(ctx(site), successors=LINE, silent=frozenset(silent),
                                  creator_timeout=8.0)
    return core.plan([doc], context, pool())


def test_the_first_successor_takes_over_a_silent_creators_job():
    plan = succession_plan(claimed(job(), "reg_b"), "reg_a", {CREATOR})
    assert plan.action == "adopt" and plan.doc is not None
    assert plan.doc["creator"] == "reg_a"
    adopted = plan.doc["history"][-1]
    assert (adopted["event"], adopted["site"], adopted["epoch"]) == ("adopted", "reg_a", 1)
    assert adopted["detail"] == ("creator global -> reg_a: no status from global for 8 s "
                                 "(automatic succession)")
    # The next successor waits while the first is heard; nobody acts on a heard creator.
    assert succession_plan(claimed(job(), "reg_b"), "reg_b", {CREATOR}).action == "none"
    assert succession_plan(claimed(job(), "reg_b"), "reg_a", set()).action == "none"


def test_the_next_successor_takes_over_when_the_one_before_is_silent_too():
    taken = succession_plan(job(), "reg_a", {CREATOR}).doc
    assert taken is not None
    assert succession_plan(taken, "reg_b", {CREATOR}).action == "none"  # reg_a is heard
    plan = succession_plan(taken, "reg_b", {CREATOR, "reg_a"})
    assert plan.action == "adopt" and plan.doc is not None
    assert plan.doc["creator"] == "reg_b"
    assert plan.doc["history"][-1]["epoch"] == 2  # a higher term
    # Straight from a silent creator too, when its first successor is silent as well.
    assert succession_plan(job(), "reg_b", {CREATOR, "reg_a"}).doc["creator"] == "reg_b"


def test_the_creator_back_takes_its_job_from_a_silent_successor_only():
    taken = succession_plan(job(), "reg_a", {CREATOR}).doc
    assert taken is not None
    # Back, it sees the higher term and stays out while the successor is heard.
    assert core.merge([taken])["creator"] == "reg_a"
    assert succession_plan(taken, CREATOR, set()).action == "none"
    plan = succession_plan(taken, CREATOR, {"reg_a"})
    assert plan.action == "adopt" and plan.doc["creator"] == CREATOR


def test_a_job_that_succeeded_under_its_successor_is_not_taken_back_by_the_old_branch():
    """Healed: the old creator's branch re-ran step 0 in a higher epoch while the
    successor's branch ended the job; the job stays ended, as the run that counted."""
    taken = succession_plan(job(), "reg_a", {CREATOR}).doc
    assert taken is not None
    ended = step(won(taken, "reg_b", epoch=1), step_status="finished")
    ended.update(step=1, job_status="success", _rev="3-a")
    old_branch = running(job(rev="5-f"), "global", epoch=3)
    merged = core.merge([ended, old_branch])
    assert (merged["job_status"], merged["creator"]) == ("success", "reg_a")
    assert (merged["job"][0]["epoch"], merged["job"][0]["winner"]) == (1, "reg_b")


def test_a_job_is_taken_over_only_once_it_too_has_been_still_for_the_timeout():
    """A creator back from silence whose new job reached us before its status keeps it."""
    still = dataclasses.replace(ctx("reg_a"), successors=LINE, silent=frozenset({CREATOR}),
                                creator_timeout=8.0, unchanged_for=7.9)
    assert core.plan([job()], still, pool()).action == "none"
    longer = dataclasses.replace(still, unchanged_for=8.0)
    assert core.plan([job()], longer, pool()).action == "adopt"


def test_succession_leaves_alone_what_is_not_its_to_take():
    outside = job(creator="reg_b")  # a creator with no line
    assert succession_plan(outside, "reg_a", {"reg_b"}).action == "none"
    not_accepted = job()
    not_accepted["created_at"] = None
    assert succession_plan(not_accepted, "reg_a", {CREATOR}).action == "none"
    ended = job()
    ended["job_status"] = "success"
    assert succession_plan(ended, "reg_a", {CREATOR}).action == "none"
    assert succession_plan(job(), "reg_c", {CREATOR}).action == "none"  # not in the line


def test_a_job_that_ended_under_a_dead_successor_with_a_live_winning_leaf_is_cleaned():
    """reg_a took over, ended the job on its branch and died before it deleted global's
    branch, which renewed its lease meanwhile: longer, it is CouchDB's winner and still
    live, so every view shows the job live. The next site of the line takes the job over
    and cleans the conflict, as only a creator does (found by test_core_sim)."""
    old_branch = running(job("any", "any", rev="7-f"), "global")  # step 1, renewing
    old_branch["job"][0].update(step_status="finished", winner="global", epoch=1)
    old_branch["step"] = 1
    ended = logged(job("any", "any", rev="7-a"), "adopted", "reg_a", 24, epoch=1)
    for index, epoch in ((0, 1), (1, 3)):
        step(ended, index, step_status="finished", winner="reg_a", epoch=epoch)
    ended.update(step=2, job_status="success")
    merged = core.merge([old_branch, ended])
    assert (merged["job_status"], merged["creator"], merged["_rev"]) == ("success", "reg_a", "7-f")

    context = dataclasses.replace(ctx("reg_b"), successors=LINE,
                                  silent=frozenset({CREATOR, "reg_a"}), creator_timeout=8.0)
    plan = core.plan([old_branch, ended], context, pool("reg_b/w1"))
    assert plan.action == "adopt" and plan.doc is not None
    assert plan.doc["_rev"] == "7-f" and plan.deletions == ("7-a",)  # one live leaf left: none
    assert (plan.doc["job_status"], plan.doc["creator"]) == ("success", "reg_b")
    adopted = plan.doc["history"][-1]
    assert (adopted["event"], adopted["site"], adopted["epoch"]) == ("adopted", "reg_b", 2)
    assert adopted["detail"].endswith("its winning revision still shows it live)")
    assert not is_live(core.merge([{**plan.doc, "_rev": "8-a"}]))
    # Nothing to take over: reg_a is heard (it cleans it itself); not reg_b's turn; the
    # ended leaf is CouchDB's winner (every view shows the job ended).
    heard = dataclasses.replace(context, silent=frozenset({CREATOR}))
    assert core.plan([old_branch, ended], heard, pool()).action == "none"
    assert core.plan([old_branch, ended], ctx("reg_a"), pool()).deletions == ("7-a",)
    not_ours = dataclasses.replace(context, site="reg_c")
    assert core.plan([old_branch, ended], not_ours, pool()).action == "none"
    ended["_rev"] = "8-a"
    assert core.plan([old_branch, ended], context, pool()).action == "none"


# --- hazard scenarios on the simulated replicated store --------------------------------------

class World:
    """Sites on their own replicas, one shared clock and ledger of executions."""

    def __init__(self, start: float = 0.0, **workers: int) -> None:
        self.clock = Clock()
        self.clock.seconds = start
        self.ledger: list[Execution] = []
        self.sites = {name: SimSite(name, n, self.clock, self.ledger)
                      for name, n in (workers or {CREATOR: 0, "reg_a": 1, "reg_b": 1}).items()}

    def __getitem__(self, name: str) -> SimSite:
        return self.sites[name]

    def create(self, job_id: str, *targets: Any) -> str:
        doc = new_job(CREATOR, [new_step(f"echo {n}", target=t) for n, t in enumerate(targets)],
                      created_at=self.clock.now(), job_id=job_id)
        assert self[CREATOR].replica.write(doc)
        return job_id

    def deliver(self, source: str, target: str, doc_id: str) -> None:
        self[target].replica.pull(self[source].replica, doc_id)

    def spread(self, doc_id: str) -> None:
        for target in self.sites.values():
            for source in self.sites.values():
                target.replica.pull(source.replica, doc_id)

    def settle(self, *doc_ids: str) -> None:
        """Replicate, decide and finish everything until the jobs end (no faults)."""
        for _ in range(50):
            for doc_id in doc_ids:
                self.spread(doc_id)
            for site in self.sites.values():
                for doc_id in doc_ids:
                    site.process(doc_id)
            for site in self.sites.values():
                for key in sorted(site.running):
                    site.finish(key)
            self.clock.seconds += 5.0
            if not any(is_live(merged(self[CREATOR], d)) for d in doc_ids):
                return
        raise AssertionError("jobs did not end")

    def runs(self, doc_id: str, step_index: int = 0) -> list[tuple[str, int]]:
        return [(e.site, e.epoch) for e in self.ledger if e.key == (doc_id, step_index)]


def merged(site: SimSite, doc_id: str) -> Doc:
    return core.merge(site.replica.live_leaves(doc_id))


def first_world_where(build: Callable[[World], bool]) -> World:
    """The first world, started at one of some clock readings, where `build` loses the hash race.

    A simulated revision's hash is that of its content: the clock reading the
    world starts at is what varies it (job ids are not part of it).
    """
    for n in range(64):
        world = World(start=n)
        if build(world):
            return world
    raise AssertionError("no start time gives the hash order the scenario needs")


def winners_by_epoch(doc: Doc, step_index: int = 0) -> dict[int, set[str]]:
    seen: dict[int, set[str]] = {}
    for entry in doc["history"]:
        if entry["step"] == step_index and entry["event"] in ("won", "started"):
            if entry["event"] == "won":
                who = entry["detail"].removeprefix("winner ")
            else:
                who = entry["site"]
            seen.setdefault(entry["epoch"], set()).add(who)
    return seen


@pytest.mark.parametrize("creator_sees_the_conflict_first", [True, False])
def test_hazard_claim_concurrent_with_a_keepalive_that_wins_the_hash(
        creator_sees_the_conflict_first):
    """Hazards 1, 2 and 5: a keep-alive re-save and a claim written on the same revision."""

    def build(world: World) -> bool:
        world.create(job_id, ["reg_a", "reg_b"])
        world.deliver(CREATOR, "reg_a", job_id)
        world.clock.seconds += 10
        touched = core.keepalive(world[CREATOR].replica.live_leaves(job_id),
                                 world[CREATOR].ctx(), stale_after=5.0)
        assert touched is not None and world[CREATOR].replica.write(touched)
        assert world["reg_a"].process(job_id) == "claim"
        keepalive = world[CREATOR].replica.winner(job_id)
        claim = world["reg_a"].replica.winner(job_id)
        return core.couch_order(keepalive) > core.couch_order(claim)

    job_id = JOB
    world = first_world_where(build)
    if creator_sees_the_conflict_first:
        world.deliver("reg_a", CREATOR, job_id)
        assert world[CREATOR].replica.winner(job_id)["job"][0]["claimed_by"] is None
        assert world[CREATOR].process(job_id) == "assign"
        world.deliver(CREATOR, "reg_a", job_id)
    else:
        world.deliver(CREATOR, "reg_a", job_id)
        # CouchDB shows reg_a the keep-alive ("open"): it keeps its claim and its worker.
        assert world["reg_a"].replica.winner(job_id)["job"][0]["claimed_by"] is None
        assert world["reg_a"].process(job_id) == "none"
        assert (job_id, 0) in world["reg_a"].booked
        world.deliver("reg_a", CREATOR, job_id)
        assert world[CREATOR].replica.winner(job_id)["job"][0]["claimed_by"] is None
        assert world[CREATOR].process(job_id) == "assign"
        world.deliver(CREATOR, "reg_a", job_id)
    assert len(world[CREATOR].replica.live_leaves(job_id)) == 1  # the creator cleaned up
    assert world["reg_a"].process(job_id) == "start"
    assert world.runs(job_id) == [("reg_a", 1)]  # the creator assigned the claimer

    world.settle(job_id)
    assert world.runs(job_id) == [("reg_a", 1)]
    assert merged(world[CREATOR], job_id)["job_status"] == "success"


def test_hazard_a_winners_release_concurrent_with_the_creators_stale_write():
    """Hazard 2: reg_a won, restarted and released; the creator wrote on the won revision.

    The creator's write (cleaning up reg_b's late claim) and reg_a's release are
    siblings of the same length, and the creator's wins CouchDB's hash: the
    winning revision says "reg_a won epoch 1" while reg_a has given it up.
    """

    def build(world: World) -> bool:
        world.create(job_id, ["reg_a", "reg_b"])
        world.create("busy", "reg_a")  # keeps reg_a's only worker busy after its restart
        for name in ("reg_a", "reg_b"):
            world.deliver(CREATOR, name, job_id)
            assert world[name].process(job_id) == "claim"
        world.deliver("reg_a", CREATOR, job_id)  # the creator has not seen reg_b's claim
        assert world[CREATOR].process(job_id) == "assign"
        world.deliver(CREATOR, "reg_a", job_id)
        world["reg_a"].restart()  # between `won` and `started`
        world.deliver(CREATOR, "reg_a", "busy")
        assert world["reg_a"].process("busy") == "start"
        world["reg_a"].queue_limit = 0  # its queue is full: it gives the win back
        assert world["reg_a"].process(job_id) == "release"
        world.deliver("reg_b", CREATOR, job_id)  # reg_b's stale claim reaches the creator
        assert world[CREATOR].process(job_id) == "resolve"
        world.deliver("reg_a", CREATOR, job_id)
        winner = world[CREATOR].replica.winner(job_id)["job"][0]
        return (winner["winner"], winner["epoch"]) == ("reg_a", 1)

    job_id = JOB
    world = first_world_where(build)
    assert len(world[CREATOR].replica.live_leaves(job_id)) == 2
    view = merged(world[CREATOR], job_id)["job"][0]
    assert (view["epoch"], view["winner"], view["claimed_by"]) == (2, None, None)
    # The creator acts on the merge, not on CouchDB's winner: it writes the release back.
    assert world[CREATOR].process(job_id) == "resolve"
    (only,) = world[CREATOR].replica.live_leaves(job_id)
    assert (only["job"][0]["epoch"], only["job"][0]["winner"]) == (2, None)
    assert world.runs(job_id) == []

    world.settle(job_id, "busy")
    check_no_double_execution(world.ledger)
    assert world.runs(job_id) == [("reg_b", 3)]  # a new winner, in a new epoch
    final = merged(world[CREATOR], job_id)
    assert final["job_status"] == "success"
    assert all(len(sites) == 1 for sites in winners_by_epoch(final).values())


@pytest.mark.parametrize("worker", ["free", "busy", "busy, queue full"])
def test_hazard_a_site_restarting_between_won_and_started(worker):
    """Hazard 2 and 6: start with a free worker; else hold the win until one frees, or
    release it when the queue is full; the step runs once."""
    world = World(**{CREATOR: 0, "reg_a": 1})
    job_id = world.create(JOB, ["reg_a", "reg_b"])
    world.create("busy", "reg_a")
    world.deliver(CREATOR, "reg_a", job_id)
    assert world["reg_a"].process(job_id) == "claim"
    world.deliver("reg_a", CREATOR, job_id)
    assert world[CREATOR].process(job_id) == "assign"
    world.deliver(CREATOR, "reg_a", job_id)
    world["reg_a"].restart()
    assert not world["reg_a"].booked
    if worker != "free":
        world.deliver(CREATOR, "reg_a", "busy")
        assert world["reg_a"].process("busy") == "start"
    if worker == "busy, queue full":
        world["reg_a"].queue_limit = 0

    action = world["reg_a"].process(job_id)
    assert action == {"free": "start", "busy": "queue", "busy, queue full": "release"}[worker]
    assert world.runs(job_id) == ([("reg_a", 1)] if worker == "free" else [])

    world.settle(job_id, "busy")
    check_no_double_execution(world.ledger)
    assert world.runs(job_id) == [("reg_a", 3 if worker == "busy, queue full" else 1)]
    assert merged(world[CREATOR], job_id)["job_status"] == "success"


def test_plan_cancel_marks_a_live_job_cancelled_once():
    doc = running(job(), "reg_a")
    plan = core.plan_cancel([doc], Context("reg_b", NOW), "operator asked")
    assert plan.action == "cancel"
    assert plan.doc["job_status"] == "cancelled"
    assert plan.doc["history"][-1]["event"] == "cancelled"
    ended = dict(doc, job_status="success")
    assert core.plan_cancel([ended], Context("reg_b", NOW), "late").action == "none"
    assert core.plan_cancel([], Context("reg_b", NOW), "nothing").action == "none"


def test_merge_never_forgets_an_epoch_a_losing_branch_issued():
    # reg_a finished step 0 and chained step 1 at epoch 1, while the creator
    # revoked step 0 (epoch 2): the revocation wins, but step 1's epoch 1 was
    # used, so the next execution of step 1 must get a higher one.
    chained = job("any", "any", rev="3-b")
    chained["step"] = 1
    chained["job"][0].update(epoch=1, winner="reg_a", claimed_by="reg_a", step_status="finished")
    chained["job"][1].update(epoch=1, winner="reg_a", claimed_by="reg_a", step_status="running")
    revoked = job("any", "any", rev="3-a")
    revoked["job"][0]["epoch"] = 2
    merged = core.merge([chained, revoked])
    assert merged["step"] == 0 and merged["job"][0]["epoch"] == 2
    assert merged["job"][1]["epoch"] == 1


def went_back_and_on(*, won_by: str) -> tuple[Doc, Doc]:
    """Two branches: on one, reg_a ran step 0 in epoch 1 and step 1, chained, in epoch 1;
    on the other, the creator revoked step 0 (epoch 2), reg_b ran it again (epoch 3),
    and the creator, never having seen the first, won step 1 to `won_by` in epoch 1."""
    ran = job("any", "any", "any", rev="5-x")
    step(ran, 0, claimed_by="reg_a", winner="reg_a", epoch=1, step_status="finished",
         finish_time=at(15))
    logged(ran, "started", "reg_a", 10, epoch=1)
    ran["step"] = 1
    logged(ran, "started", "reg_a", 20, epoch=1)
    step(ran, 1, claimed_by="reg_a", winner="reg_a", epoch=1, step_status="finished")
    ran["step"] = 2
    went_back = job("any", "any", "any", rev="6-l")
    step(went_back, 0, claimed_by="reg_b", winner="reg_b", epoch=3, step_status="finished",
         finish_time=at(30))
    went_back["step"] = 1
    step(went_back, 1, claimed_by=won_by, winner=won_by, epoch=1, lease_until=at(10_000))
    return ran, went_back


def test_a_win_in_an_epoch_its_site_already_started_the_step_in_is_released():
    """The branch where step 0 went back outranks the one that ran step 1: the win it
    issued in epoch 1 is reg_a's token of that run, which the history keeps."""
    leaves = went_back_and_on(won_by="reg_a")
    plan = core.plan(list(leaves), ctx("reg_a"), pool("reg_a/w1"))
    assert plan.action == "release" and plan.after == ()
    released = apply(plan)
    assert (released["step"], current(released)["epoch"], current(released)["winner"]) == (
        1, 2, None)
    # That run, had it gone on, ends as a stale finish: it followed an end of step 0
    # that does not count (its start is not written again late, in the win's epoch).
    ran, went_back = leaves
    ran["step"] = 1
    step(ran, 1, step_status="running", executioner="reg_a/w1", lease_until=at(10_000))
    finish = core.plan_finish([ran, went_back], ctx("reg_a"), pool(), (JOB, 1), 1,
                              "reg_a/w1", Outcome(), after=core.follows(ran, 1))
    assert finish.action == "stale_finish" and apply(finish)["step"] == 1
    # Another site's win in that epoch is another token: it starts.
    other = core.plan(list(went_back_and_on(won_by="reg_b")), ctx("reg_b"), pool("reg_b/w1"))
    assert other.after == (Launch((JOB, 1), 1, "reg_b/w1"),)


def test_an_epoch_is_issued_above_every_epoch_the_history_shows_at_the_step():
    """The step's record can hold a lower epoch than one a dropped branch issued (its
    run's `started` event is all that is left of it): a win, a direct start and a
    release each go above it."""
    def dropped_run(doc: Doc) -> Doc:
        return logged(doc, "started", "reg_a", 20, epoch=2)

    won_plan = decide(dropped_run(claimed(job(), "reg_a", epoch=1)), CREATOR, pool())
    assert won_plan.action == "assign" and current(apply(won_plan))["epoch"] == 3
    started = decide(dropped_run(step(job(), epoch=1)), CREATOR, pool("global/w1"))
    assert current(apply(started))["epoch"] == 3
    assert started.after == (Launch(KEY, 3, "global/w1"),)
    released = decide(dropped_run(won(job(), "reg_a", epoch=1)), "reg_a", pool())
    assert released.action == "release" and current(apply(released))["epoch"] == 3
    # An adoption's term is no epoch.
    adopted = logged(claimed(job(), "reg_a", epoch=1), "adopted", CREATOR, 30, epoch=7)
    assert current(apply(decide(adopted, CREATOR, pool())))["epoch"] == 2


def test_renew_only_touches_a_lease_that_is_running_out():
    doc = running(job(), "reg_a", epoch=1)
    doc["job"][0]["lease_until"] = "2026-01-01T00:01:00.000000Z"
    running_out = core.plan_renew(
        [doc], Context("reg_a", "2026-01-01T00:00:50.000000Z", lease=60), KEY, 1,
        renew_below=45)
    assert running_out.action == "renew"  # 10 s left
    assert running_out.doc["job"][0]["lease_until"] == "2026-01-01T00:01:50.000000Z"
    plenty = core.plan_renew(
        [doc], Context("reg_a", "2026-01-01T00:00:10.000000Z", lease=60), KEY, 1,
        renew_below=45)
    assert plenty.action == "none"  # 50 s left: no write yet


def test_the_creator_revokes_only_a_lease_it_has_itself_seen_silent_for_a_lease():
    """Deadlines are written on the winner's clock and read on the creator's: past its
    deadline, a lease is revoked only once the creator has also seen it unchanged
    for a lease and a margin on its own clock (renewals change it)."""
    doc = step(running(job(), "reg_a"), lease_until=at(100))

    def plan_at(seconds: float, silence: dict[str, float] | None) -> str:
        now = Context(CREATOR, at(seconds), lease=60, skew_margin=10, lease_silence=silence)
        return core.plan([doc], now, pool()).action

    assert plan_at(111, None) == "revoke"  # untracked: the deadline alone decides
    assert plan_at(105, {at(100): 500.0}) == "none"  # silent long, but within the margin
    assert plan_at(111, {at(100): 69.0}) == "none"  # seen for less than 60 + 10 s
    assert plan_at(111, {}) == "none"  # never seen before: seen just now
    assert plan_at(111, {at(100): 71.0}) == "revoke"


# --- jobs written over HTTP: only what the submitter writes ------------------------------

def http_job(rev: str = "1-h", **fields: Any) -> Doc:
    """A job as a user POSTs it to CouchDB: every other field takes its default."""
    return {"_id": JOB, "_rev": rev, "type": "job", "creator": CREATOR,
            "job": [{"target": "any", "do": "make"}], **fields}


def test_the_creator_accepts_an_http_job_in_the_revision_that_starts_it():
    plan = decide(http_job(), the_pool=pool("global/w1"))
    assert plan.action == "start"
    assert validate_job(plan.doc) == []
    assert plan.doc["created_at"] == plan.doc["updated_at"] == NOW
    assert events(plan.doc) == ["created", "started"]  # accepted first, then started
    assert plan.doc["job"][0]["retry_strategy"]["max_retries"] == 0  # defaults written in
    assert plan.doc["priority"] == 0 and plan.doc["job_status"] is None


def test_the_creator_accepts_an_http_job_even_when_it_has_nothing_else_to_do():
    plan = decide(http_job(job=[{"target": "reg_a", "do": "make"}]), the_pool=pool("global/w1"))
    assert plan.action == "accept"
    assert plan.doc["created_at"] == NOW
    assert events(plan.doc) == ["created"]
    accepted = dict(plan.doc, _rev="2-a")
    assert decide(accepted).action == "none"  # accepted once


def test_other_sites_leave_an_http_job_alone_until_its_creator_accepts_it():
    sole = http_job(job=[{"target": "reg_a", "do": "make"}])
    assert decide(http_job(), "reg_a", pool("reg_a/w1")).action == "none"
    assert decide(sole, "reg_a", pool("reg_a/w1")).action == "none"
    accepted = decide(sole, the_pool=pool()).doc
    assert decide(dict(accepted, _rev="2-a"), "reg_a", pool("reg_a/w1")).action == "start"


def test_a_write_made_before_the_job_was_accepted_merges_with_the_accepted_one():
    cancelled = core.plan_cancel([http_job()], Context("reg_a", at(5)), "operator").doc
    accepted = decide(http_job(), the_pool=pool()).doc
    leaves = [dict(cancelled, _rev="2-c"), dict(accepted, _rev="2-a")]
    usable, rejected = core.usable_leaves(leaves)
    assert rejected == [] and len(usable) == 2
    merged = core.merge(usable)
    assert merged["created_at"] == NOW and merged["job_status"] == "cancelled"
    # Two creation times do define two jobs.
    other = dict(accepted, _rev="2-b", created_at=at(1))
    assert [rev for rev, _ in core.usable_leaves([leaves[1], other])[1]] == ["2-a"]


def test_keepalive_waits_for_the_creator_to_accept_a_job():
    assert core.keepalive([http_job()], ctx(), stale_after=1.0) is None
    resaved = core.keepalive([http_job(created_at=T0)], ctx(), stale_after=1.0)
    assert resaved is not None and resaved["keepalive_at"] == NOW


# --- assignment by room (status documents) -----------------------------------------

def room_ctx(site: str = CREATOR, room: dict[str, int] | None = None,
             assigning: frozenset[str] = frozenset(), now: str = NOW) -> Context:
    return Context(site, now, frozenset({"global", "reg_a", "reg_b"}), room=room,
                   assigning=assigning)


def test_a_busy_creator_assigns_an_open_step_to_a_site_with_room():
    plan = core.plan([job("any")], room_ctx(room={"reg_a": 0, "reg_b": 2}), pool())
    assert plan.action == "assign" and plan.doc is not None
    step_now = current(plan.doc)
    assert (step_now["claimed_by"], step_now["winner"], step_now["epoch"]) == ("reg_b", "reg_b", 1)
    assert step_now["lease_until"] > NOW  # start by then, or the creator revokes it
    assert plan.doc["history"][-1]["detail"] == "winner reg_b (it has room)"
    assert plan.before == (core.Assign(KEY, "reg_b"),)
    # The winner starts it as it starts any step it won: one hop after submission.
    started = core.plan([{**plan.doc, "_rev": "2-b"}], room_ctx("reg_b"), pool("reg_b/w1"))
    assert started.action == "start" and current(started.doc)["step_status"] == "running"


def test_a_creator_with_a_free_worker_starts_the_step_itself():
    plan = core.plan([job("any")], room_ctx(room={"reg_a": 3}), pool("global/w1"))
    assert plan.action == "start" and current(plan.doc)["winner"] == CREATOR


def test_assignment_follows_the_target_and_needs_room():
    assert core.plan([job("reg_a")], room_ctx(room={"reg_a": 0, "reg_b": 5}),
                     pool()).action == "none"
    assert core.plan([job("any")], room_ctx(room={"reg_a": -1}), pool()).action == "none"
    assert core.plan([job("any")], room_ctx(room=None), pool()).action == "none"
    targeted = core.plan([job(["global", "reg_a"])], room_ctx(room={"reg_a": 1, "reg_b": 9}),
                         pool())
    assert current(targeted.doc)["winner"] == "reg_a"
    # A step with one target site is that site's to start: assigning it too would race it.
    assert core.plan([job("reg_a")], room_ctx(room={"reg_a": 2}), pool()).action == "none"
    # An unknown site's room is no reason to give it anything.
    assert core.plan([job("any")], room_ctx(room={"reg_z": 4}), pool()).action == "none"


def test_a_free_worker_elsewhere_beats_a_bigger_queue():
    """A free worker starts the step at once; a queue only when one of its workers frees."""
    ctx = dataclasses.replace(room_ctx(room={"reg_a": 8, "reg_b": 3}),
                              idle={"reg_a": 0, "reg_b": 1})
    assert current(core.plan([job("any")], ctx, pool()).doc)["winner"] == "reg_b"


def test_equal_rooms_are_shared_out_by_job():
    winners = set()
    for n in range(20):
        doc = job("any")
        doc["_id"] = f"job-{n}"
        plan = core.plan([doc], room_ctx(room={"reg_a": 1, "reg_b": 1}), pool())
        winners.add(current(plan.doc)["winner"])
    assert winners == {"reg_a", "reg_b"}


def test_a_site_holds_back_its_claim_while_an_assigning_creator_may_still_assign():
    fresh = job("any")
    fresh["updated_at"] = at(599)
    assigning = frozenset({CREATOR})
    assert core.plan([fresh], room_ctx("reg_a", assigning=assigning),
                     pool("reg_a/w1")).action == "none"
    # Open for longer than the delay: the creator did not assign it, so claim it.
    fresh["updated_at"] = at(590)
    assert core.plan([fresh], room_ctx("reg_a", assigning=assigning),
                     pool("reg_a/w1")).action == "claim"
    # A creator not known to assign (no status, or a stale one): claim at once.
    fresh["updated_at"] = at(599)
    assert core.plan([fresh], room_ctx("reg_a"), pool("reg_a/w1")).action == "claim"
    # A step whose only target we are is started at once, as before.
    only_ours = job("reg_a")
    only_ours["updated_at"] = at(599)
    assert core.plan([only_ours], room_ctx("reg_a", assigning=assigning),
                     pool("reg_a/w1")).action == "start"


def test_a_site_fed_by_the_creator_lately_leaves_its_steps_to_it_for_longer():
    """A creator that gave us a step within the claim delay is live and gives us work
    as it learns of our room: a claim would race its next assignment and cost a claim
    and a win more for the same start. Not for ever: a belief may be wrong."""
    long_open = job("any")
    long_open["updated_at"] = at(595)  # 5 s: past claim_delay, within fed_claim_delay
    assigning = frozenset({CREATOR})
    fed = dataclasses.replace(room_ctx("reg_a", assigning=assigning), fed_by=assigning)
    assert core.plan([long_open], fed, pool("reg_a/w1")).action == "none"
    assert core.plan([long_open], room_ctx("reg_a", assigning=assigning),
                     pool("reg_a/w1")).action == "claim"
    long_open["updated_at"] = at(590)  # open for fed_claim_delay: claim even so
    assert core.plan([long_open], fed, pool("reg_a/w1")).action == "claim"
    # Fed, but by a creator not known to assign (a stale status): claim as before.
    stale = dataclasses.replace(room_ctx("reg_a"), fed_by=assigning)
    assert core.plan([long_open], stale, pool("reg_a/w1")).action == "claim"


def test_a_step_long_in_the_creators_line_is_left_to_it_while_our_worker_just_freed():
    """In a burst every step waits in the creator's line, so its age says nothing of
    whether the creator feeds us: a worker that just freed waits for the creator's
    next assignment, and claims only once it has been free for the delay too."""
    queued = job("any")
    queued["updated_at"] = at(580)  # 20 s in the creator's line
    assigning = frozenset({CREATOR})
    fed = dataclasses.replace(room_ctx("reg_a", assigning=assigning), fed_by=assigning)
    for ctx, delay in ((fed, core.FED_CLAIM_DELAY),
                       (room_ctx("reg_a", assigning=assigning), core.CLAIM_DELAY)):
        just_freed = dataclasses.replace(pool("reg_a/w1"), idle_for=0.05)
        assert core.plan([queued], ctx, just_freed).action == "none"
        long_free = dataclasses.replace(pool("reg_a/w1"), idle_for=delay)
        assert core.plan([queued], ctx, long_free).action == "claim"
    # Our worker booked for this very step: our claim was decided and its write lost.
    booked = dataclasses.replace(pool(), idle_for=0.0,
                                 booked={(queued["_id"], 0): core.Booking("reg_a/w1", 1.0)})
    assert core.plan([queued], fed, booked).action == "claim"
    # A new step waits for the creator however long our worker has been free.
    fresh = job("any")
    fresh["updated_at"] = at(599)
    idle = dataclasses.replace(pool("reg_a/w1"), idle_for=3600.0)
    assert core.plan([fresh], fed, idle).action == "none"
    # A creator not known to assign: claim at once, as in the thesis.
    assert core.plan([queued], room_ctx("reg_a"),
                     dataclasses.replace(pool("reg_a/w1"), idle_for=0.0)).action == "claim"


def test_an_assigned_site_without_a_free_worker_releases_the_step():
    plan = core.plan([job("any")], room_ctx(room={"reg_a": 1}), pool())
    released = core.plan([{**plan.doc, "_rev": "2-b"}], room_ctx("reg_a"), pool())
    assert released.action == "release" and current(released.doc)["epoch"] == 2
    assert current(released.doc)["winner"] is None


def test_a_revoked_site_is_named_so_that_the_creator_stops_assigning_to_it():
    doc = running(job("any"), "reg_a")
    step(doc, lease_until=at(100))
    plan = core.plan([doc], room_ctx(), pool())
    assert plan.action == "revoke"
    assert plan.before == (core.Revoke(KEY, "reg_a"),)


# --- progress ---------------------------------------------------------------------------

def report(fraction: float, message: str, seconds: float) -> Doc:
    return {"fraction": fraction, "message": message, "at": at(seconds)}


def test_renew_writes_new_progress_with_the_lease_and_nothing_twice():
    doc = step(running(job(), "reg_a", epoch=1), lease_until=at(660))
    now = Context("reg_a", NOW, lease=60)
    plan = core.plan_renew([doc], now, KEY, 1, renew_below=45, report=report(0.4, "vol 3", 599))
    assert plan.action == "renew"  # 60 s of lease left: written for the progress alone
    assert plan.doc["job"][0]["progress"] == report(0.4, "vol 3", 599)
    assert plan.doc["job"][0]["lease_until"] == at(660)  # renewed in the same revision
    written = {**plan.doc, "_rev": "2-b"}
    again = core.plan_renew([written], now, KEY, 1, renew_below=45,
                            report=report(0.4, "vol 3", 599))
    assert again.action == "none"  # nothing new: no write


def test_a_stale_execution_never_writes_its_progress():
    doc = step(running(job(), "reg_b", epoch=2), lease_until=at(620))
    for site, epoch in (("reg_a", 1), ("reg_b", 1), ("reg_a", 2)):  # an old run, or not ours
        plan = core.plan_renew([doc], Context(site, NOW), KEY, epoch,
                               report=report(0.9, "still going", 599))
        assert plan.action == "none", (site, epoch)


def test_merge_keeps_the_newest_progress_of_the_current_execution_only():
    older = step(running(job(rev="3-a"), "reg_a"), progress=report(0.2, "early", 20))
    newer = step(running(job(rev="3-b"), "reg_a"), progress=report(0.6, "later", 40))
    cancelled = {**copy.deepcopy(older), "_rev": "3-z", "job_status": "cancelled"}
    # CouchDB's winner, the cancellation, carries the older report: the newer one stays.
    assert core.merge([cancelled, newer])["job"][0]["progress"] == report(0.6, "later", 40)
    assert core.merge([older, newer])["job"][0]["progress"] == report(0.6, "later", 40)
    # A release in a new epoch fences off what the old run reported.
    released = step(job(rev="4-a"), epoch=2)
    assert core.merge([released, newer])["job"][0]["progress"] is None
    # Another site's run in the same epoch number (across a partition) lends nothing.
    elsewhere = step(running(job(rev="3-c"), "reg_b"), progress=None)
    merged = core.merge([elsewhere, newer])
    assert merged["job"][0]["winner"] == "reg_b" and merged["job"][0]["progress"] is None


def test_release_and_start_clear_progress_and_a_finish_keeps_the_last_report():
    doc = step(running(job(), "reg_a"), progress=report(0.5, "half", 20))
    released = core.plan([doc], ctx("reg_a"), pool()).doc  # no execution here: released
    assert released["job"][0]["progress"] is None
    last = report(1.0, "done", 599)
    plan = core.plan_finish([doc], ctx("reg_a"), pool(), KEY, 1, "reg_a/w1",
                            Outcome(progress=last))
    assert plan.doc["job"][0]["progress"] == last
    assert plan.doc["job"][0]["step_status"] == "finished"
    kept = core.plan_finish([doc], ctx("reg_a"), pool(), KEY, 1, "reg_a/w1", Outcome())
    assert kept.doc["job"][0]["progress"] == report(0.5, "half", 20)  # nothing newer printed


# --- broadcast steps (docs/protocol.md, "Broadcast steps") ----------------------------

SITES3 = {"global", "reg_a", "reg_b"}


def broadcast(*later: Any, policy: str | None = None, rev: str = "1-a") -> Doc:
    """A job whose step 0 runs at every site, then steps of the given targets."""
    doc = job("all", *later, rev=rev)
    if policy is not None:
        doc["job"][0]["each_policy"] = policy
    return doc


def opened(doc: Doc, *sites: str) -> Doc:
    return step(doc, step_status="running", start_time=at(1),
                runs={site: new_sub_run() for site in sites or sorted(SITES3)})


def sub(doc: Doc, site: str, **fields: Any) -> Doc:
    current(doc)["runs"][site].update(fields)
    return doc


def done(doc: Doc, site: str, status: str = "finished", epoch: int = 1) -> Doc:
    return sub(doc, site, status=status, epoch=epoch, exit_code=0 if status == "finished" else 1,
               attempts=1, finish_time=at(5))


def apply(plan: Plan) -> Doc:
    assert plan.doc is not None, plan
    assert validate_job(plan.doc) == [], validate_job(plan.doc)
    return plan.doc


def test_the_creator_opens_a_broadcast_at_the_sites_it_knows_and_starts_its_own_part():
    plan = core.plan([broadcast()], ctx(known=SITES3), pool("global/w1"))
    doc = apply(plan)
    assert sorted(current(doc)["runs"]) == sorted(SITES3)
    assert current(doc)["runs"]["global"]["status"] == "running"
    assert current(doc)["runs"]["reg_a"] == new_sub_run()
    assert (current(doc)["epoch"], current(doc)["winner"]) == (0, None)
    assert events(doc)[-2:] == ["opened", "started"]
    assert doc["history"][-2]["detail"] == "at global, reg_a, reg_b"
    assert plan.after == (Launch(KEY, 1, "global/w1"),)


def test_only_the_creator_opens_and_other_sites_wait_for_it():
    assert decide(broadcast(), "reg_a", pool("reg_a/w1"), known=SITES3).action == "none"
    assert apply(decide(broadcast(), known=SITES3)).get("history")[-1]["event"] == "opened"


def test_a_listed_broadcast_leaves_out_sites_the_creator_does_not_know():
    doc = job(["reg_a", "reg_x"])
    step(doc, each=True)
    opened_doc = apply(decide(doc, known=SITES3))
    assert list(current(opened_doc)["runs"]) == ["reg_a"]
    assert opened_doc["history"][-1]["detail"] == "at reg_a; not known sites, left out: reg_x"


def test_a_broadcast_listing_only_any_names_no_site_and_fails_rather_than_run_nowhere():
    # `any` names no site of a broadcast step: opened at no site, the step would count as
    # finished at every site (0), never run. Validation refuses it; one written where
    # validation was off (or before it refused it) is failed by its creator.
    doc = job(["any"])
    step(doc, each=True)
    assert [error.split(":")[0] for error in validate_job(doc)] == ["job[0].each"]
    failed = decide(doc, known=SITES3).doc  # (as invalid as the document it was made from)
    assert failed is not None
    assert failed["job_status"] == "failed" and current(failed).get("runs") is None
    assert "no known site matches target ['any']" in failed["history"][-1]["detail"]
    # Chained onto a finish (opened at no site): its creator fails it, never ends it.
    chained = step(job("any", ["any"]), 1, each=True, step_status="running", runs={})
    chained["step"] = 1
    assert decide(chained, known=SITES3).action == "fail"


def test_a_site_starts_its_own_part_on_sight_and_no_other():
    doc = opened(broadcast())
    plan = decide(doc, "reg_a", pool("reg_a/w1"), known=SITES3)
    started = apply(plan)
    assert current(started)["runs"]["reg_a"]["status"] == "running"
    assert current(started)["runs"]["reg_b"]["status"] is None
    assert started["history"][-1]["site"] == "reg_a" and started["history"][-1]["epoch"] == 1
    assert plan.before == (Book(KEY, "reg_a/w1"),)
    assert decide(doc, "reg_a", pool(), known=SITES3).action == "none"  # no worker: waits


def test_a_part_opened_afresh_starts_above_every_epoch_its_site_started_it_in():
    """A branch where an earlier step went back opened the step again with fresh parts;
    the branch whose parts ran is gone, but the history keeps their starts."""
    doc = opened(broadcast())
    logged(doc, "started", "reg_a", 20, epoch=2)
    logged(doc, "started", "reg_b", 21, epoch=5)  # another site's start: not reg_a's floor
    plan = decide(doc, "reg_a", pool("reg_a/w1"), known=SITES3)
    assert current(apply(plan))["runs"]["reg_a"]["epoch"] == 3
    assert plan.after == (Launch(KEY, 3, "reg_a/w1"),)
    reopening = logged(broadcast(), "started", "global", 20, epoch=1)
    plan = core.plan([reopening], ctx(known=SITES3), pool("global/w1"))
    assert current(apply(plan))["runs"]["global"]["epoch"] == 2
    assert plan.after == (Launch(KEY, 2, "global/w1"),)


def test_a_sub_run_finish_is_fenced_by_its_epoch_and_site():
    doc = sub(opened(broadcast()), "reg_a", status="running", epoch=2)
    finish = core.plan_finish([doc], ctx("reg_a"), pool("reg_a/w1"), KEY, 2, "reg_a/w1",
                              Outcome())
    assert current(apply(finish))["runs"]["reg_a"]["status"] == "finished"
    stale = core.plan_finish([doc], ctx("reg_a"), pool("reg_a/w1"), KEY, 1, "reg_a/w1",
                             Outcome())
    assert stale.action == "stale_finish"
    other = core.plan_finish([doc], ctx("reg_b"), pool("reg_b/w1"), KEY, 2, "reg_b/w1",
                             Outcome())
    assert other.action == "stale_finish"  # (2, reg_b) was never issued


def test_the_creator_ends_the_step_when_the_last_part_finishes_and_chains_its_next():
    doc = done(done(opened(broadcast("global")), "reg_a"), "reg_b")
    doc = sub(doc, "global", status="running", epoch=1)
    plan = core.plan_finish([doc], ctx(known=SITES3), pool("global/w1"), KEY, 1, "global/w1",
                            Outcome())
    ended = apply(plan)
    assert ended["step"] == 1 and current(ended)["step_status"] == "running"
    assert ended["job"][0]["step_status"] == "finished"
    assert events(ended)[-3:] == ["finished", "finished", "started"]
    assert ended["history"][-2]["detail"] == "finished at every site (3)"
    assert plan.after == (Launch((JOB, 1), 1, "global/w1"),)


def test_a_site_finishing_last_leaves_the_end_to_the_creator():
    doc = sub(done(done(opened(broadcast()), "global"), "reg_a"), "reg_b", status="running",
              epoch=1)
    finished = apply(core.plan_finish([doc], ctx("reg_b"), pool("reg_b/w1"), KEY, 1,
                                      "reg_b/w1", Outcome()))
    assert finished["step"] == 0 and finished["job_status"] is None
    ended = apply(decide(finished, known=SITES3))
    assert ended["job_status"] == "success"


@pytest.mark.parametrize(("policy", "statuses", "expected"), [
    ("all", {"global": "finished", "reg_a": "failed", "reg_b": None}, "failed"),
    ("all", {"global": "finished", "reg_a": "finished", "reg_b": "running"}, None),
    ("any", {"global": "failed", "reg_a": "failed", "reg_b": "running"}, None),
    ("any", {"global": "failed", "reg_a": "finished", "reg_b": "failed"}, "success"),
    ("any", {"global": "failed", "reg_a": "failed", "reg_b": "failed"}, "failed"),
])
def test_each_policy_decides_how_the_step_ends(policy, statuses, expected):
    doc = opened(broadcast(policy=policy))
    for site, status in statuses.items():
        sub(doc, site, status=status, epoch=1 if status else 0)
    plan = decide(doc, known=SITES3)
    if expected is None:
        assert plan.action == "none"
        return
    assert apply(plan)["job_status"] == expected


def test_the_creator_revokes_an_expired_sub_run_lease_for_that_site_alone():
    doc = sub(opened(broadcast()), "reg_a", status="running", epoch=1, lease_until=at(100))
    sub(doc, "reg_b", status="running", epoch=1, lease_until=at(10_000))
    plan = decide(doc, known=SITES3)
    revoked = apply(plan)
    assert current(revoked)["runs"]["reg_a"] == {**new_sub_run(), "epoch": 2}
    assert current(revoked)["runs"]["reg_b"]["status"] == "running"
    assert revoked["history"][-1]["detail"] == f"lease of reg_a expired at {at(100)}"
    assert revoked["history"][-1]["epoch"] == 2
    reg_b_runs = pool(running={KEY: Running("reg_b/w1", 1)})
    assert decide(doc, "reg_b", reg_b_runs, known=SITES3).action == "none"  # creator only


def test_a_site_back_from_a_restart_releases_its_part_and_kills_a_superseded_run():
    doc = sub(opened(broadcast()), "reg_a", status="running", epoch=1)
    plan = decide(doc, "reg_a", pool("reg_a/w1"), known=SITES3)
    assert plan.action == "release"
    assert current(apply(plan))["runs"]["reg_a"]["epoch"] == 2
    revoked = sub(copy.deepcopy(doc), "reg_a", status=None, epoch=2)
    kill = decide(revoked, "reg_a", pool(running={KEY: Running("reg_a/w1", 1)}), known=SITES3)
    assert kill.before == (Kill(KEY, "execution superseded"),)


def test_merge_combines_sub_runs_site_by_site_whatever_the_leaf_order():
    base = opened(broadcast())
    a = done(copy.deepcopy(base), "reg_a")
    a["_rev"] = "3-aaa"
    b = sub(copy.deepcopy(base), "reg_b", status="running", epoch=1, lease_until=at(50))
    b["_rev"] = "3-fff"
    c = sub(copy.deepcopy(base), "reg_b", status="running", epoch=1, lease_until=at(90))
    c = done(c, "global")
    c["_rev"] = "2-zzz"
    merged = core.merge([a, b, c])
    assert merged == core.merge([c, b, a]) == core.merge([b, a, c])
    runs = current(merged)["runs"]
    assert runs["reg_a"]["status"] == "finished" and runs["global"]["status"] == "finished"
    assert runs["reg_b"]["lease_until"] == at(90)  # the newest renewal of one execution
    revoked = sub(copy.deepcopy(base), "reg_b", status=None, epoch=2)
    revoked["_rev"] = "2-000"
    assert current(core.merge([revoked, c]))["runs"]["reg_b"]["epoch"] == 2  # never reissued


def test_a_drop_survives_any_concurrent_write_and_lets_the_step_end():
    base = done(done(opened(broadcast()), "global"), "reg_a")
    dropped = apply(core.plan_drop([base], ctx(), "reg_b", "lost"))
    assert current(dropped)["dropped"] == ["reg_b"]
    assert dropped["history"][-1]["detail"] == "reg_b: lost"
    late = sub(copy.deepcopy(base), "reg_b", status="running", epoch=5)
    late["_rev"] = "9-zzz"
    merged = core.merge([dropped, late])
    assert current(merged)["dropped"] == ["reg_b"]
    assert not core.backs_execution(merged, KEY, 5, "reg_b")
    assert apply(core.plan([dropped, late], ctx(known=SITES3), pool()))["job_status"] == "success"


@pytest.mark.parametrize(("doc", "site", "at_site", "problem"), [
    (broadcast(), "reg_b", CREATOR, "step 0 is not open yet"),
    (job("any"), "reg_b", CREATOR, "step 0 is not a broadcast step"),
    (opened(broadcast()), "reg_x", CREATOR, "reg_x is not one of step 0's sites"),
    (opened(broadcast()), "reg_b", "reg_a", "only the job's creator drops sites"),
    (done(opened(broadcast()), "reg_b"), "reg_b", CREATOR, "reg_b's run of step 0 already"),
])
def test_drop_problem_says_why_nothing_is_dropped(doc, site, at_site, problem):
    assert problem in (core.drop_problem(core.merge([doc]), ctx(at_site), site) or "")
    assert core.plan_drop([doc], ctx(at_site), site, "lost") == core.NOTHING


def test_the_creator_drops_a_part_for_a_site_it_does_not_know():
    doc = opened(broadcast(), "global", "reg_zz")
    dropped = apply(decide(doc, known=SITES3))
    assert current(dropped)["dropped"] == ["reg_zz"]
    assert dropped["history"][-1]["detail"] == "reg_zz: not a known site"
    assert decide(doc, "reg_a", known=SITES3).action == "none"  # the creator's call


# --- waiting: for other jobs to end, for a time --------------------------------------

def waiting(*awaited: str, policy: str | None = None, not_before: str | None = None,
            **kw: Any) -> Doc:
    doc = job(**kw)
    doc["after"] = list(awaited)
    if policy is not None:
        doc["after_policy"] = policy
    if not_before is not None:
        doc["not_before"] = not_before
    return doc


def decide_waiting(doc: Doc, site: str = CREATOR, ended: dict[str, str] | None = None,
                   now: str = NOW, the_pool: PoolView | None = None) -> Plan:
    context = dataclasses.replace(ctx(site, now=now), ended=ended or {})
    return core.plan([doc], context, the_pool or pool("w1"))


def test_a_waiting_job_stays_while_an_awaited_job_has_not_ended_or_is_unknown():
    doc = waiting("job-a", "job-b")
    assert validate_job(doc) == []
    assert decide_waiting(doc).action == "none"  # neither seen ended (one may not exist yet)
    assert decide_waiting(doc, ended={"job-a": "success"}).action == "none"


@pytest.mark.parametrize("site", ["reg_a", "reg_b"])
def test_other_sites_never_take_a_waiting_job_whatever_they_know(site):
    doc = waiting("job-a", not_before=at(0))  # its time has come, its job succeeded
    plan = decide_waiting(doc, site, ended={"job-a": "success"}, the_pool=pool("w1"))
    assert plan.action == "none" and plan.doc is None and not plan.before
    sole = waiting("job-a")
    step(sole, target="reg_a")
    assert decide_waiting(sole, "reg_a", ended={"job-a": "success"}).action == "none"


def test_the_creator_releases_and_starts_in_one_revision_once_every_awaited_job_succeeded():
    doc = waiting("job-a", "job-b")
    plan = decide_waiting(doc, ended={"job-a": "success", "job-b": "success"})
    assert plan.action == "start"
    assert events(plan.doc)[-2:] == ["ready", "started"]
    assert plan.doc["history"][-2]["detail"] == \
        "released from wait: job-a success, job-b success"
    assert current(plan.doc)["step_status"] == "running" and current(plan.doc)["epoch"] == 1
    assert not is_waiting(plan.doc)
    assert validate_job(plan.doc) == []
    # The released job is an ordinary one for every site: claimable, decided as usual.
    released = {**plan.doc, "_rev": "2-a"}
    assert decide_waiting(released, "reg_a").action == "none"  # running at the creator


def test_a_creator_without_room_releases_alone_and_other_sites_then_claim():
    doc = waiting("job-a")
    plan = decide_waiting(doc, ended={"job-a": "success"}, the_pool=pool())
    assert plan.action == "ready" and events(plan.doc)[-1] == "ready"
    assert step_phase(current(plan.doc)) == Phase.OPEN
    released = {**plan.doc, "_rev": "2-a"}
    assert decide_waiting(released, "reg_a", the_pool=pool("w1")).action == "claim"


@pytest.mark.parametrize(("status", "reason"), [
    ("failed", "waited for job-b, which failed"),
    ("cancelled", "waited for job-b, which was cancelled"),
])
def test_a_failed_or_cancelled_awaited_job_fails_the_waiting_job_naming_it(status, reason):
    doc = waiting("job-a", "job-b")
    plan = decide_waiting(doc, ended={"job-b": status})  # at once: job-a need not end first
    assert plan.action == "fail" and plan.doc["job_status"] == "failed"
    assert plan.doc["history"][-1]["event"] == "failed"
    assert plan.doc["history"][-1]["detail"] == reason
    assert (plan.reason, plan.doc["history"][-1]["reason"]) == (Reason.WAITED_FOR, "waited_for")
    assert current(plan.doc)["winner"] is None  # it never ran
    # Another site never decides so, whatever it knows.
    assert decide_waiting(doc, "reg_a", ended={"job-b": status}).action == "none"


def test_after_policy_always_runs_once_every_awaited_job_ended_however():
    doc = waiting("job-a", "job-b", policy="always")
    assert decide_waiting(doc, ended={"job-a": "failed"}).action == "none"
    plan = decide_waiting(doc, ended={"job-a": "failed", "job-b": "cancelled"})
    assert plan.action == "start"
    assert plan.doc["history"][-2]["detail"] == \
        "released from wait: job-a failed, job-b cancelled"


def test_a_delayed_job_waits_for_the_creators_clock_only():
    doc = waiting(not_before=at(700))  # NOW is at(600)
    assert is_waiting(doc)
    assert decide_waiting(doc).action == "none"
    assert decide_waiting(doc, now=at(699.999)).action == "none"
    assert decide_waiting(doc, "reg_a", now=at(800)).action == "none"  # not its clock
    plan = decide_waiting(doc, now=at(700))
    assert plan.action == "start"
    assert plan.doc["history"][-2]["detail"] == f"released from wait: not before {at(700)}"
    # Fraction digits of either time do not change the comparison (no string order).
    short = waiting(not_before="2026-01-01T00:11:40Z")
    assert decide_waiting(short, now="2026-01-01T00:11:39.5Z").action == "none"


def test_jobs_and_a_time_both_must_be_passed():
    doc = waiting("job-a", not_before=at(700))
    assert decide_waiting(doc, ended={"job-a": "success"}).action == "none"
    assert decide_waiting(doc, now=at(701)).action == "none"
    plan = decide_waiting(doc, ended={"job-a": "success"}, now=at(701))
    assert plan.doc["history"][-2]["detail"] == \
        f"released from wait: job-a success, not before {at(700)}"


def test_the_release_survives_a_concurrent_write_that_lacks_it():
    """The held state is the history's, a union in the merge: a cancellation or
    another write made on the waiting revision never brings the wait back."""
    doc = waiting("job-a")
    released = core.plan([doc], dataclasses.replace(ctx(), ended={"job-a": "success"}),
                         pool()).doc
    released["_rev"] = "2-a"
    sibling = {**copy.deepcopy(doc), "_rev": "2-b", "meta": {"x": 1}}  # e.g. a stray write
    merged = core.merge([released, sibling])
    assert not is_waiting(merged)
    assert not is_waiting(core.merge([sibling, released]))


def test_a_run_launched_on_a_release_whose_write_was_lost_is_stale():
    """The creator released the job and started its step in one write, whose answer
    was lost and which a successor's revision then outranked: the run's report finds
    the job still waiting. No start is written late on it; the run is stale."""
    plan = core.plan_finish([waiting("job-a")], ctx(CREATOR), pool(f"{CREATOR}/w1"), KEY, 1,
                            f"{CREATOR}/w1", Outcome())
    assert plan.action == "stale_finish" and plan.doc["step"] == 0
    assert "started" not in events(plan.doc) and is_waiting(plan.doc)


def test_the_keepalive_never_resaves_a_waiting_job():
    doc = waiting("job-a")
    assert core.keepalive([doc], ctx(now=at(10_000)), stale_after=30) is None
    done = waiting("job-a")
    logged(done, "ready", CREATOR, 5)
    assert core.keepalive([done], ctx(now=at(10_000)), stale_after=30) is not None


def test_a_waiting_job_is_cancelled_as_any_other():
    doc = waiting("job-a")
    plan = core.plan_cancel([doc], ctx("reg_b"), "not needed")
    assert plan.doc["job_status"] == "cancelled"
    assert decide_waiting({**plan.doc, "_rev": "2-a"}, ended={"job-a": "success"}).doc is None


# --- the size limit: what a revision sheds to fit -------------------------------------


def test_a_revision_far_below_the_limit_is_left_as_it_is() -> None:
    doc = new_job("global", [new_step("true"), new_step("true")])
    doc["job"][0]["output"] = {"stdout": "x" * 1000, "stderr": ""}
    before = json_copy(doc)
    core.fit(doc, keep_events_from=len(doc["history"]))
    assert doc == before


def test_a_revision_over_the_limit_sheds_old_claims_but_never_a_used_token() -> None:
    """Claims go; a stale finish stays: it is what tells a win of its epoch spent."""
    doc = step(job("reg_a", "any"), 0)
    doc["step"] = 1
    logged(doc, "stale_finish", "reg_b", 5, epoch=1)
    for index in range(MAX_DOC_SIZE // 100):
        logged(doc, "claimed", f"reg_{index % 7}", 6, detail="x" * 20)
    assert json_size(doc) > MAX_DOC_SIZE
    core.fit(doc, keep_events_from=len(doc["history"]) - 1)
    assert json_size(doc) <= MAX_DOC_SIZE
    kinds = [entry["event"] for entry in doc["history"]]
    assert "stale_finish" in kinds and "claimed" in kinds[-1:]


def test_a_revision_short_in_python_but_over_the_limit_in_javascript_sheds_old_outputs(
) -> None:
    """Python writes a lone surrogate as one character, JavaScript as six: the quick
    measure must not let such a revision through."""
    doc = new_job("global", [new_step("true"), new_step("true")])
    doc["job"][0]["output"] = {"stdout": "\ud800" * (MAX_DOC_SIZE // 6 + 10), "stderr": ""}
    doc["job"][1]["output"] = {"stdout": "kept", "stderr": ""}
    assert len(json.dumps(doc, ensure_ascii=False)) < MAX_DOC_SIZE < json_size(doc)
    core.fit(doc, keep_events_from=len(doc["history"]))
    assert doc["job"][0]["output"] is None
    assert doc["job"][1]["output"] == {"stdout": "kept", "stderr": ""}
    assert json_size(doc) <= MAX_DOC_SIZE
