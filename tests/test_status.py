"""Site status documents: what a site publishes, what others make of it, and the one-hop start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from jobdist import status
from jobdist.couch import Couch, Database, Forbidden
from jobdist.couch_sync import sync_design_docs
from jobdist.design import load_design_docs
from jobdist.document_rules import validate_site_status
from jobdist.lab.cluster import LocalCluster
from jobdist.lab.localserver import LocalServer
from jobdist.lab.scenarios import site_db, wait_until_done, write_sites
from jobdist.model import Reason, new_job, new_step
from jobdist.status import Board, Publisher, SiteStatus

from .helpers import wait_for

NOW = "2026-01-01T00:00:00Z"


def site_status(site: str = "reg_a", free: int = 2, **fields: Any) -> SiteStatus:
    values: dict[str, Any] = dict(site=site, workers=4, free_workers=free, draining=False,
                                  assigns=True, restricted=False, updated_at=NOW)
    return SiteStatus(**(values | fields))


# --- pure: the document, the board, the publisher ------------------------------------


def test_a_status_round_trips_through_its_document():
    doc = site_status().as_doc()
    assert doc["_id"] == "site-reg_a" and doc["type"] == "site"
    assert validate_site_status(doc) == []
    assert SiteStatus.parse(doc) == site_status()


@pytest.mark.parametrize("change, error", [
    ({"_id": "site-reg_b"}, '_id: must be "site-" followed by the site\'s name'),
    ({"free_workers": -1}, "free_workers: must be an integer between 0 and 1000000000"),
    ({"draining": "no"}, "draining: must be true or false"),
    ({"updated_at": "yesterday"}, "updated_at: must be an ISO 8601 UTC time"),
    ({"free": 3}, "free: unknown field"),
])
def test_a_malformed_status_is_refused_and_ignored(change: dict[str, Any], error: str):
    doc = site_status().as_doc() | change
    assert any(message.startswith(error) for message in validate_site_status(doc))
    assert SiteStatus.parse(doc) is None
    assert not Board("global").hear(doc, 0.0)


QUEUE = 4  # site_status's workers: the wins a site may hold beyond its free workers


def test_room_counts_fresh_statuses_less_what_we_assigned():
    board = Board("global")
    assert board.hear(site_status("reg_a", 2).as_doc(), now=0.0)  # news: more room
    assert board.hear(site_status("reg_b", 1, draining=True).as_doc(), now=0.0)
    board.hear(site_status("global", 4).as_doc(), now=0.0)  # our own: not counted
    assert board.room(0.0) == {"reg_a": 2 + QUEUE, "reg_b": 0}
    board.note_assigned(("job-1", 0), "reg_a", now=0.5)
    assert board.room(1.0)["reg_a"] == 1 + QUEUE
    # Started: it took a free worker, until the site's status counts it, or for a while.
    board.saw_job("job-1", won_by("reg_a", started=True), now=1.0)
    assert board.room(1.0)["reg_a"] == 1 + QUEUE
    assert board.room(0.5 + status.ASSIGNED_FOR)["reg_a"] == 2 + QUEUE
    board.note_assigned(("job-2", 0), "reg_a", now=10.0)
    board.saw_job("job-2", won_by("reg_a", started=True), now=10.5)
    assert not board.hear(site_status("reg_a", 1).as_doc(), now=12.0)  # less room: no news
    assert board.room(12.0)["reg_a"] == 1 + QUEUE
    # A start beyond the free workers took a worker freed since: the queue is not touched.
    for n in range(3, 6):
        board.note_assigned((f"job-{n}", 0), "reg_a", now=12.0)
        board.saw_job(f"job-{n}", won_by("reg_a", started=True), now=12.0)
    assert board.room(12.0)["reg_a"] == QUEUE
    # A status not renewed for long is ignored: the site may be gone.
    assert "reg_a" not in board.room(12.0 + status.STALE_AFTER)


def ended_by(site: str, job_id: str = "job-1") -> dict[str, Any]:
    doc = won_by(site, started=True)
    doc["_id"] = job_id
    doc["job"][0]["step_status"] = "finished"
    doc["job_status"] = "success"
    return doc


def test_an_assigned_step_that_ended_frees_its_worker_before_the_sites_status_says_so():
    """A short step's end comes back sooner than the site's next status (a changed room
    at most once a second): its worker is counted free again at once."""
    board = Board("global")
    board.hear(site_status("reg_a", 2).as_doc(), now=0.0)
    board.note_assigned(("job-1", 0), "reg_a", now=0.1)
    board.note_assigned(("job-2", 0), "reg_a", now=0.1)
    assert board.room(0.1) == {"reg_a": QUEUE}
    assert board.saw_job("job-1", ended_by("reg_a"), now=0.3)  # room again: assign now
    assert board.room(0.3) == {"reg_a": 2 + QUEUE - 1}  # job-2 still waits to start
    board.saw_job("job-2", won_by("reg_a", started=True) | {"_id": "job-2"}, now=0.4)
    assert board.room(0.4) == {"reg_a": 1 + QUEUE}
    assert not board.saw_job("job-2", None, now=0.45)  # unreadable: says nothing
    assert board.room(0.45) == {"reg_a": 1 + QUEUE}
    # Its next step chained onto the same worker: still busy.
    chained = won_by("reg_a", started=True) | {"_id": "job-2", "step": 1}
    chained["job"] = [*chained["job"], dict(chained["job"][0])]
    assert not board.saw_job("job-2", chained, now=0.5)
    assert board.room(0.5) == {"reg_a": 1 + QUEUE}
    deleted = {"_id": "job-2", "_rev": "9-x", "_deleted": True}
    assert board.saw_job("job-2", deleted, now=0.6)  # gone: its worker is free again too
    assert board.room(0.6) == {"reg_a": 2 + QUEUE}


def test_a_forgotten_site_gets_no_room_until_it_publishes_again():
    board = Board("global")
    board.hear(site_status("reg_a", 2).as_doc(), now=0.0)
    board.forget("reg_a")  # its lease was revoked: dead, or cut off
    assert board.room(1.0) == {}
    assert board.hear(site_status("reg_a", 2).as_doc(), now=2.0)  # back: news
    assert board.room(2.0) == {"reg_a": 2 + QUEUE}


def test_restricted_sites_get_no_room_and_assigning_creators_are_known():
    board = Board("reg_a")
    board.hear(site_status("global", 3, restricted=True).as_doc(), now=0.0)
    board.hear(site_status("reg_b", 3, assigns=False).as_doc(), now=0.0)
    assert board.room(1.0) == {"global": 0, "reg_b": 3 + QUEUE}
    assert board.assigning(1.0) == {"global"}
    assert board.assigning(status.STALE_AFTER + 1.0) == frozenset()


def won_by(site: str | None, started: bool = False, creator: str = "global") -> dict[str, Any]:
    doc = new_job(creator, [new_step("true")], created_at=NOW, job_id="job-1")
    doc["job"][0].update(claimed_by=site, winner=site, epoch=1,
                         step_status="running" if started else None)
    return doc


def test_a_win_not_started_counts_against_its_sites_room_until_it_starts():
    board = Board("global")
    board.hear(site_status("reg_a", free=0).as_doc(), now=0.0)
    assert board.room(0.0) == {"reg_a": QUEUE}
    assert not board.saw_job("job-1", won_by("reg_a"), now=1.0)
    assert board.room(1.0) == {"reg_a": QUEUE - 1}
    # However long it takes (no timer): until the job shows it started, or went away.
    assert board.room(status.STALE_AFTER - 1.0) == {"reg_a": QUEUE - 1}
    assert board.saw_job("job-1", won_by("reg_a", started=True), now=2.0)  # room again
    assert board.room(2.0) == {"reg_a": QUEUE}
    board.saw_job("job-1", won_by("reg_a"), now=3.0)
    assert board.saw_job("job-1", None, now=4.0)
    # Another creator's win counts too: it fills the same queue.
    board.saw_job("job-2", won_by("reg_a", creator="reg_b"), now=5.0)
    assert board.room(5.0) == {"reg_a": QUEUE - 1}
    assert board.saw_job("job-2", None, now=5.0)
    # Only wins of other sites, only what a well-formed job says.
    for doc in (won_by("global"), won_by(None),
                {"type": "job", "creator": "global", "step": 3, "job": []},
                {"type": "job", "creator": "global", "step": 0, "job": ["x"]}):
        assert not board.saw_job("job-3", doc, now=5.0)
    assert board.room(5.0) == {"reg_a": QUEUE}


def test_a_site_knows_which_creators_gave_it_a_step_lately():
    """A win of ours not started, in another creator's job: that creator is feeding us
    (core.placement.holds_claims); our own jobs, others' wins and started steps say nothing."""
    board = Board("reg_a")
    board.saw_job("job-1", won_by("reg_b"), now=1.0)
    board.saw_job("job-1", won_by("reg_a", started=True), now=1.0)
    board.saw_job("job-1", won_by("reg_a", creator="reg_a"), now=1.0)
    assert board.feeding(1.0, within=2.0) == frozenset()
    board.saw_job("job-1", won_by("reg_a"), now=1.0)
    assert board.feeding(2.9, within=2.0) == {"global"}
    board.saw_job("job-1", won_by("reg_a"), now=2.5)  # the same win again: no news
    assert board.feeding(3.0, within=2.0) == frozenset()  # it lapses unless renewed
    again = won_by("reg_a")
    again["job"][0]["epoch"] = 2  # a new win of the same step
    board.saw_job("job-1", again, now=2.5)
    assert board.feeding(3.0, within=2.0) == {"global"}


def test_a_site_with_a_free_worker_is_told_apart_from_a_queue():
    board = Board("global")
    board.hear(site_status("reg_a", free=0).as_doc(), now=0.0)
    board.hear(site_status("reg_b", free=1).as_doc(), now=0.0)
    assert board.rooms(0.0) == ({"reg_a": QUEUE, "reg_b": 1 + QUEUE}, {"reg_a": 0, "reg_b": 1})


def test_a_site_that_gave_a_win_back_for_want_of_a_worker_is_queued_nothing_for_a_while():
    """A daemon from before queues, or a queue other creators filled: it releases what it
    cannot start, and queueing more would only send steps back and forth."""
    board = Board("global")
    board.hear(site_status("reg_a", free=1).as_doc(), now=0.0)
    released = won_by(None)
    released["history"].append({"event": "released", "step": 0, "site": "reg_a", "at": NOW,
                                "detail": "some words", "reason": "no_worker"})
    board.saw_job("job-1", won_by("reg_a"), now=1.0)
    board.saw_job("job-1", released, now=1.0)
    assert board.room(1.0) == {"reg_a": 1}
    board.saw_job("job-1", released, now=20.0)  # the same release seen again: no news
    assert board.room(1.0 + status.QUEUE_BACKOFF[Reason.NO_WORKER]) == {"reg_a": 1 + QUEUE}
    # A full queue (other creators' counts lag ours): a moment. Any other reason, or no
    # reason code (whatever the words): none.
    for now, reason, backoff in (
            (50.0, "queue_full", status.QUEUE_BACKOFF[Reason.QUEUE_FULL]),
            (60.0, "win_lapsed", 0.0), (70.0, None, 0.0), (80.0, ["no_worker"], 0.0)):
        released["history"][-1]["reason"] = reason
        board.saw_job("job-1", won_by("reg_a"), now=now)
        board.saw_job("job-1", released, now=now)
        assert board.room(now + backoff) == {"reg_a": 1 + QUEUE}
        if backoff:
            assert board.room(now) == {"reg_a": 1}


def test_the_publisher_sends_a_changed_room_soon_and_the_same_one_rarely():
    publisher = Publisher()
    assert publisher.due(site_status(free=2), 0.0)
    publisher.published(site_status(free=2), "1-a", 0.0)
    assert not publisher.due(site_status(free=2), 5.0)
    assert not publisher.due(site_status(free=1), 0.5)  # at most once a MIN_INTERVAL
    assert publisher.due(site_status(free=1), status.MIN_INTERVAL)
    assert publisher.due(site_status(free=2), status.REFRESH)


def test_a_changed_room_waits_to_settle_unless_open_steps_wait():
    """No open step we may run: a changed room is published once it held for SETTLE (a
    worker freed and taken again at once is no news). Open steps waiting: at once. A
    room back to what was published is nothing to publish."""
    publisher = Publisher()
    publisher.published(site_status(free=2), "1-a", 0.0)
    later = status.MIN_INTERVAL + 1.0
    assert publisher.due(site_status(free=1), later, urgent=True)
    assert not publisher.due(site_status(free=1), later, urgent=False)
    assert publisher.due_at(site_status(free=1), later + 0.1, urgent=False) == \
        later + status.SETTLE  # since it was first seen changed
    assert not publisher.due(site_status(free=2), later + 0.2, urgent=False)  # back
    assert not publisher.due(site_status(free=0), later + status.SETTLE, urgent=False)
    assert publisher.due(site_status(free=0), later + 2 * status.SETTLE, urgent=False)


def test_a_status_that_failed_is_tried_again_a_moment_later():
    """The manager wakes for a publication due: one the server refused must not be due
    again at once, or the manager would spin while the server is away."""
    publisher = Publisher()
    assert publisher.due(site_status(free=2), 0.0)
    publisher.failed(0.0)
    assert not publisher.due(site_status(free=2), 0.5)
    assert publisher.due(site_status(free=2), status.MIN_INTERVAL)


# --- the server's rules are the same ----------------------------------------------------


@pytest.fixture
def jobs_db(couch_server: LocalServer) -> Iterator[Database]:
    couch = Couch(couch_server.url)
    db = couch.ensure_database("status_rules")
    sync_design_docs(db, load_design_docs())
    yield db
    couch.call("drop", couch.client.delete_database, db.name)


@pytest.mark.parametrize("change", [
    {}, {"_id": "site-reg_b"}, {"free_workers": 1.5}, {"assigns": None}, {"extra": 1},
    {"site": "Not A Site", "_id": "site-Not A Site"},
])
def test_validate_doc_update_judges_statuses_as_python_does(jobs_db: Database,
                                                            change: dict[str, Any]):
    doc = site_status().as_doc() | change
    expected = "; ".join(validate_site_status(doc))
    try:
        jobs_db.save(doc)
        refused = ""
    except Forbidden as error:
        refused = error.reason
    assert refused == expected


# --- on real sites: statuses replicate and a remote step starts one hop after submission


@pytest.mark.e2e
def test_a_busy_creator_assigns_to_a_site_with_room(tmp_path: Path) -> None:
    sites = write_sites(tmp_path / "sites", 3, workers=1, topology="star")
    with LocalCluster(sites, tmp_path / "state", in_memory=True) as cluster:
        db = site_db(cluster, "global")
        for site in ("reg_a", "reg_b"):  # statuses pass the filtered replication too
            wait_for(lambda site=site: db.get(status.status_id(site)), 30,
                     f"the status of {site} at global")
        blocker = new_job("global", [new_step("sleep 3", target="global")])
        db.save(blocker)
        wait_until_running(db, blocker["_id"])
        job = new_job("global", [new_step("true")])
        db.save(job)
        (done,) = wait_until_done(db, [job["_id"]], 60)
    events = [entry["event"] for entry in done["history"]]
    winner = done["job"][0]["winner"]
    assert done["job_status"] == "success" and winner in ("reg_a", "reg_b")
    assert "claimed" not in events, events  # assigned, not claimed
    won = next(entry for entry in done["history"] if entry["event"] == "won")
    assert won["detail"] == f"winner {winner} (it has room)" and won["site"] == "global"


def wait_until_running(db: Database, job_id: str) -> None:
    def running() -> bool:
        doc = db.get(job_id)
        return bool(doc and doc["job"][0].get("step_status") == "running")
    wait_for(running, 30, f"{job_id} running")


def test_statuses_are_not_jobs_to_the_views(jobs_db: Database) -> None:
    jobs_db.save(site_status().as_doc())
    for path in ("jobdist/_view/claimable", "jobdist/_view/stale_open", "jobdist/_view/involving",
                 "jobdist_people/_view/live", "jobdist_people/_view/by_status"):
        response = requests.get(f"{jobs_db.url}/_design/{path}", timeout=10)
        response.raise_for_status()
        assert all(not row["id"].startswith("site-") for row in response.json()["rows"])


def test_silence_counts_on_our_clock_from_the_last_new_status_heard():
    board = Board("reg_a", started=100.0)
    lines = ("global", "reg_b", "reg_a")
    assert board.silent(lines, 105.0, timeout=8.0) == frozenset()  # we just started
    assert board.silent(lines, 108.0, timeout=8.0) == {"global", "reg_b"}  # never us
    board.hear(site_status("global", updated_at="2020-01-01T00:00:00.000000Z").as_doc(), 110.0)
    assert board.silent(lines, 117.0, timeout=8.0) == {"reg_b"}
    # The same status delivered again is no news; a new one is, whatever its clock says.
    board.hear(site_status("global", updated_at="2020-01-01T00:00:00.000000Z").as_doc(), 117.0)
    assert "global" in board.silent(lines, 118.0, timeout=8.0)
    board.hear(site_status("global", updated_at="1999-01-01T00:00:00.000000Z").as_doc(), 118.0)
    assert "global" not in board.silent(lines, 125.0, timeout=8.0)
    board.forget("global")  # a revoked lease forgets the room, not when we heard it
    assert "global" not in board.silent(lines, 125.0, timeout=8.0)
    board.restart_silence(200.0)  # our CouchDB was away: count afresh
    assert board.silent(lines, 207.0, timeout=8.0) == frozenset()


def test_an_unchanged_status_is_published_again_at_its_refresh():
    publisher = Publisher(2.0)  # (Timings.status_refresh: tests/test_timings.py)
    publisher.published(site_status(free=2), "1-a", 0.0)
    assert not publisher.due(site_status(free=2), 1.9)
    assert publisher.due(site_status(free=2), 2.0)
