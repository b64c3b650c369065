"""The backlog: open steps as the feed showed them, the `claimable` view's rows in
Python, so that a freed worker finds its next step without a request."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobdist.backlog import Backlog, open_targets
from jobdist.clock import utc_now
from jobdist.core import claim_rank, spread
from jobdist.lab.sim import Replica, SimStore
from jobdist.listener import Changed
from jobdist.manager import Manager
from jobdist.model import Doc, event, new_job, new_step, new_sub_run
from jobdist.periodic_work import NET_SCAN_IDLE, SCAN_INTERVAL, VIEW_SCAN_INTERVAL
from jobdist.status import SiteStatus
from jobdist.store import Open, Written

from .test_design import BROADCAST, HTTP_DOCS, UNOPENED, run_design_functions, t
from .test_manager import creator_alone, serve_until


def job(*steps: Doc, **fields: object) -> Doc:
    return {"type": "job", "creator": "alpha", "created_at": t(1), "job": list(steps),
            **fields}


HELD = job({"do": "make"}, after=["other"])
CORPUS: list[Doc] = [
    *HTTP_DOCS, BROADCAST, UNOPENED, HELD,
    {**HELD, "history": [event("ready", step=0, site="alpha", at=t(2))]},
    job({"do": "make", "target": ["beta", "gamma"]}, priority=4),
    job({"do": "make", "target": "all"}),
    job({"do": "make", "winner": "beta"}),
    job({"do": "make", "step_status": "finished"}, {"do": "next", "target": "gamma"}, step=1),
    job({"do": "make"}, step=1),  # past its last step
    job({"do": "make", "target": "gamma", "step_status": "running", "each": True,
         "runs": {"gamma": new_sub_run(), "beta": {**new_sub_run(), "status": "running"}}}),
    {**job({"do": "make", "target": None}), "step": None},
    {"type": "schedule", "job": [{"do": "make"}]},
    {**job({"do": "make"}), "_deleted": True},
]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_open_targets_are_the_claimable_views_rows_for_every_kind_of_document() -> None:
    rows = run_design_functions(CORPUS, "claimable")["claimable"]
    for doc, emitted in zip(CORPUS, rows, strict=True):
        if doc.get("_deleted"):
            emitted = []  # a server indexes no deleted document
        assert open_targets(doc) == [key[0] for key, _ in emitted], doc


def test_the_first_in_line_by_rank_then_creation_leaving_out_the_passed() -> None:
    backlog = Backlog("beta")
    docs = {"old": job({"do": "a"}, created_at=t(1)),
            "urgent": job({"do": "b"}, created_at=t(2), priority=9),  # 6 levels younger
            "new": job({"do": "c"}, created_at=t(3)),
            "elsewhere": job({"do": "d", "target": "gamma"}, created_at=t(0))}
    for doc_id, doc in docs.items():
        backlog.saw(doc_id, doc)
    assert set(backlog.open) == {"old", "urgent", "new"}  # gamma's alone is not ours
    assert backlog.first(3, set()) == ["urgent", "old", "new"]
    assert backlog.first(1, {"urgent"}) == ["old"]
    assert backlog.open["old"][0] == claim_rank(0, t(1))
    backlog.saw("urgent", {**docs["urgent"], "job": [{"do": "b", "claimed_by": "gamma"}]})
    backlog.saw("new", None)  # unreadable: the view's scan will tell
    assert backlog.first(5, set()) == ["old"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d", "e"]),
                          st.sampled_from([None, "open", "urgent", "taken", "ours"])),
                max_size=40),
       st.sets(st.sampled_from(["a", "b", "c", "d", "e"])), st.integers(1, 6))
def test_the_line_is_the_open_steps_sorted_whatever_the_revisions_seen(
        seen: list[tuple[str, str | None]], passed: set[str], limit: int) -> None:
    """The backlog keeps its line in order as revisions come (a place that moves, a job
    taken or unreadable): it reads as a sort of every open step would."""
    backlog = Backlog("beta")
    kinds: dict[str | None, Doc | None] = {
        None: None, "open": job({"do": "a"}), "urgent": job({"do": "a"}, priority=3),
        "taken": job({"do": "a", "claimed_by": "gamma"}),
        "ours": job({"do": "a"}, creator="beta", created_at=t(2))}
    for doc_id, kind in seen:
        backlog.saw(doc_id, kinds[kind])
    in_place = sorted(backlog.open, key=lambda doc_id: (backlog.open[doc_id], doc_id))
    assert backlog.first(limit, passed) == \
        [doc_id for doc_id in in_place if doc_id not in passed][:limit]
    assert [doc_id for doc_id, _ in backlog.created_here(limit, passed)] == \
        [doc_id for doc_id in in_place if doc_id not in passed
         and backlog.kept.get(doc_id, {}).get("creator") == "beta"][:limit]
    assert len(backlog.line) == len(backlog.open)



def test_a_site_takes_its_own_jobs_first_then_the_others_in_its_spread_order() -> None:
    """Within a rank, the jobs a site created come first, oldest first (it starts them
    at once), then the others' in its own `spread` order: in creation order every
    site's freed workers went for the steps the creator was starting, a claim lost and
    a conflict resolved for each."""
    def second(n: int) -> str:  # of one 10-second band: one rank
        return f"2026-11-22T00:01:0{n}.000000Z"

    others = {f"alpha-{n:02d}": job({"do": "a"}, created_at=second(n % 5)) for n in range(20)}
    own = {"beta-new": job({"do": "b"}, creator="beta", created_at=second(4)),
           "beta-old": job({"do": "b"}, creator="beta", created_at=second(3))}
    urgent = {"alpha-urgent": job({"do": "c"}, created_at=second(4), priority=1)}
    lines = {}
    for site in ("beta", "gamma"):
        backlog = Backlog(site)
        for doc_id, doc in {**others, **own, **urgent}.items():
            backlog.saw(doc_id, doc)
        lines[site] = backlog.first(30, set())
        assert lines[site][0] == "alpha-urgent"  # the rank still comes first
    spread_order = sorted(others, key=lambda doc_id: spread("beta", doc_id))
    assert lines["beta"][1:] == ["beta-old", "beta-new", *spread_order]
    assert lines["gamma"][1:3] != lines["beta"][3:5]  # each site its own order

class ViewCountingStore(SimStore):
    def __init__(self, replica: Replica, name: str) -> None:
        super().__init__(replica, name)
        self.view_scans = 0
        self.reads_of: Counter[str] = Counter()
        self.writes: list[list[str]] = []  # the documents of each write

    def claimable(self, target: str, limit: int) -> list[Open]:
        self.view_scans += 1
        return super().claimable(target, limit)

    def read(self, ids: Iterable[str]) -> dict[str, list[Doc]]:
        ids = list(ids)
        self.reads_of.update(ids)
        return super().read(ids)

    def open_created(self, creator: str, limit: int) -> list[str]:
        self.view_scans += 1
        return super().open_created(creator, limit)

    def write(self, docs: Sequence[Doc]) -> list[Written]:
        self.writes.append([doc["_id"] for doc in docs])
        return super().write(docs)


def test_a_freed_worker_takes_the_next_step_from_the_backlog_without_a_view_query(
        tmp_path: Path) -> None:
    store = ViewCountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)  # one worker
    try:
        serve_until(manager, lambda: store.view_scans > 0, "the first scan, at start")
        scans = store.view_scans
        jobs = [new_job("global", [new_step("true")]) for _ in range(4)]
        assert all(store.write(jobs))
        feed(manager, store, jobs)  # one start; the others wait for the worker
        serve_until(manager, lambda: all(
            store.replica.winner(job["_id"])["job_status"] == "success" for job in jobs),
            "every job ended")
        assert store.view_scans == scans
        assert not manager.periodic.backlog.open
    finally:
        manager.pool.shutdown(1.0)


def test_an_empty_backlog_asks_the_view_again_only_while_it_may_know_of_more(
        tmp_path: Path) -> None:
    """The view's answer held every open step and none was left out: what opened since
    came through the feed, so an empty backlog is the truth until VIEW_SCAN_INTERVAL.
    Asked again as soon as the backlog runs dry (SCAN_INTERVAL) after the start's first
    answer (the view is read `update=lazy`: it may be stale), after one cut at its
    limit, and after one whose rows we left out (more than the free workers take)."""
    store = ViewCountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)  # one worker: 4 rows a query
    periodic = manager.periodic
    try:
        def scan_after(seconds: float) -> list[str]:
            periodic.last_view_scan -= seconds
            periodic.last_scan -= seconds
            return periodic.claimable_due(lambda: ("global/w1",), draining=False)

        assert scan_after(0.0) == [] and store.view_scans == 2  # at start: both targets
        assert periodic.view_cut  # the first answer after the start
        assert scan_after(SCAN_INTERVAL) == [] and store.view_scans == 4
        assert not periodic.view_cut
        assert scan_after(SCAN_INTERVAL) == [] and store.view_scans == 4
        assert scan_after(VIEW_SCAN_INTERVAL) == [] and store.view_scans == 6

        ours = [new_job("reg_b", [new_step("true", target="global")]) for _ in range(3)]
        anyone = [new_job("reg_b", [new_step("true")]) for _ in range(3)]
        assert all(store.write([*ours, *anyone]))  # never fed to us
        assert len(scan_after(VIEW_SCAN_INTERVAL)) == 4 and store.view_scans == 8
        assert periodic.view_cut  # 3 rows a target, below the limit: but 2 left out
        assert len(scan_after(SCAN_INTERVAL)) == 4 and store.view_scans == 10

        more = [new_job("reg_b", [new_step("true")]) for _ in range(2)]
        assert all(store.write(more))
        assert len(scan_after(SCAN_INTERVAL)) == 4 and store.view_scans == 12
        assert periodic.view_cut  # 5 rows for "any": cut at the limit
    finally:
        manager.pool.shutdown(1.0)


def test_the_views_periodic_query_waits_for_a_worker_that_stays_free(tmp_path: Path) -> None:
    """Every VIEW_SCAN_INTERVAL the view is asked for what the feed never showed, once a
    worker has been free for NET_SCAN_IDLE: not at the moment a step's end frees one,
    when the next report is likely on its way."""
    store = ViewCountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)
    periodic = manager.periodic
    try:
        def scan(idle: float) -> None:
            periodic.last_view_scan -= VIEW_SCAN_INTERVAL
            periodic.scan_soon()
            periodic.claimable_due(lambda: ("global/w1",), False, lambda: idle)

        scan(idle=0.0)  # the start's first answer: it may be stale, so asked again
        scan(idle=0.0)
        assert store.view_scans == 4 and not periodic.view_cut
        scan(idle=NET_SCAN_IDLE / 2)
        assert store.view_scans == 4
        scan(idle=NET_SCAN_IDLE)
        assert store.view_scans == 6
    finally:
        manager.pool.shutdown(1.0)

def test_a_site_that_created_no_job_asks_no_view_for_open_steps_to_give(
        tmp_path: Path) -> None:
    """A site with room announced, and no job of our own seen since the start (whose
    recovery read every live one): no `stale_open` query. One job of ours seen, and
    the next scan asks."""
    store = ViewCountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)
    periodic = manager.periodic
    try:
        periodic.hear_status(SiteStatus("reg_a", workers=2, free_workers=2, draining=False,
                                        assigns=True, restricted=False,
                                        updated_at=utc_now()).as_doc())
        periodic.last_scans["open-step"] -= VIEW_SCAN_INTERVAL
        periodic.assign_scan_due = True
        assert periodic.open_for_room_due() == [] and store.view_scans == 0

        theirs = new_job("reg_b", [new_step("true")])
        periodic.saw_job(theirs["_id"], theirs)
        periodic.assign_scan_due = True
        assert periodic.open_for_room_due() == [] and store.view_scans == 0

        ours = new_job("global", [new_step("true", target="reg_a")])
        assert all(store.write([ours]))
        periodic.saw_job(ours["_id"], ours)  # not in our backlog: it does not name us
        periodic.assign_scan_due = True
        assert periodic.open_for_room_due() == [(ours["_id"], None)]
        assert store.view_scans == 1
    finally:
        manager.pool.shutdown(1.0)

@pytest.mark.parametrize("start_write_delay", [0.0, 1.0])
def test_a_step_end_and_the_next_start_are_one_write_with_no_read(
        tmp_path: Path, start_write_delay: float) -> None:
    """The worker a step frees starts the next open step in line in the same batch as the
    end, on the revision the feed showed (the backlog kept it): written in the same
    `_bulk_docs` as the end, or (a deferred start) with its own end."""
    store = ViewCountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store, start_write_delay=start_write_delay)
    try:
        jobs = [new_job("global", [new_step("true")]) for _ in range(4)]
        assert all(store.write(jobs))
        store.writes.clear()
        feed(manager, store, jobs)
        serve_until(manager, lambda: all(
            store.replica.winner(job["_id"])["job_status"] == "success" for job in jobs),
            "every job ended")
        ids = [job["_id"] for job in jobs]
        first = next(doc_id for doc_id in ids if [doc_id] in store.writes)  # started alone
        waited = [doc_id for doc_id in ids if doc_id != first]
        if start_write_delay:
            jobs_written = sorted(write for write in store.writes if set(write) & set(ids))
            assert jobs_written == sorted([doc_id] for doc_id in ids)  # one write each
        else:
            assert sum(len(write) == 2 for write in store.writes) == 3  # an end and a start
        assert not any(store.reads_of[doc_id] for doc_id in waited)
    finally:
        manager.pool.shutdown(1.0)


def test_a_creator_gives_a_site_with_room_its_open_steps_from_the_backlog(
        tmp_path: Path) -> None:
    """Room announced: the open steps the feed showed go to the site on the revisions it
    showed, with no view query and no read."""
    store = ViewCountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)  # one worker
    try:
        serve_until(manager, lambda: store.view_scans > 0, "the first scans, at start")
        jobs = [new_job("global", [new_step("sleep 5")]) for _ in range(3)]
        assert all(store.write(jobs))
        feed(manager, store, jobs)  # one start; no room known: the others wait
        serve_until(manager, lambda: manager.counts["steps_started"] == 1, "one start")
        scans, store.reads_of = store.view_scans, Counter()
        status = SiteStatus("reg_a", workers=1, free_workers=1, draining=False, assigns=True,
                            restricted=False, updated_at=utc_now()).as_doc()
        assert all(store.write([status]))
        feed(manager, store, [status])
        running = {key[0] for key in manager.ledger.runs()}  # (its start maybe unwritten)
        waiting = [job["_id"] for job in jobs if job["_id"] not in running]
        assert len(waiting) == 2
        serve_until(manager, lambda: all(store.replica.winner(doc_id)["job"][0]["winner"]
                                         == "reg_a" for doc_id in waiting),
                    "both given to reg_a: a free worker and a queue of one")
        assert store.view_scans == scans
        assert not any(store.reads_of[doc_id] for doc_id in waiting)
    finally:
        manager.pool.shutdown(1.0)


def feed(manager: Manager, store: SimStore, docs: Sequence[Doc]) -> None:
    """What the listener hands the manager: each job's winner, once written."""
    for seq, doc in enumerate(docs):
        winner = store.replica.winner(doc["_id"])
        assert winner is not None
        manager.mailbox.inbox.put(Changed(doc["_id"], winner["_rev"], seq, winner))


def test_open_steps_a_view_scan_found_and_left_wait_in_the_backlog(tmp_path: Path) -> None:
    store = ViewCountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)  # one worker
    try:
        jobs = [new_job("global", [new_step("sleep 5")]) for _ in range(3)]
        assert all(store.write(jobs))  # the feed never shows them: only the view does
        serve_until(manager, lambda: manager.counts["steps_started"] == 1, "one start")
        started = {key[0] for key in manager.ledger.runs()}  # (its start maybe unwritten)
        assert len(started) == 1
        assert set(manager.periodic.backlog.open) == {job["_id"] for job in jobs} - started
    finally:
        manager.pool.shutdown(1.0)


def test_our_own_revision_fed_without_its_document_leaves_the_backlog_as_our_write_did(
        tmp_path: Path) -> None:
    """The listener feeds changes without documents after one it could not decode. For
    a revision of ours no read follows (no decision is due), so the backlog keeps what
    our write told it: an open step stays in line."""
    store = ViewCountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)
    try:
        job = new_job("reg_b", [new_step("true")])
        assert all(store.write([job]))
        written = store.replica.winner(job["_id"])
        manager.periodic.saw_job(job["_id"], written)  # as after our write
        manager.own_revs.append(written["_rev"])
        assert manager.pool.book(("job-x", 0)) is not None  # no free worker: it waits
        manager.mailbox.inbox.put(Changed(job["_id"], written["_rev"], 1, None))
        manager.serve_once(timeout=0.05)
        assert job["_id"] in manager.periodic.backlog.open
    finally:
        manager.pool.shutdown(1.0)
