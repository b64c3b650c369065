"""The result journal: a step that ends while its site's CouchDB is down keeps its result.

The journal alone (durable, bounded, readable after a restart), then a real
manager over a real pouchdb-server that is SIGKILLed while a step runs.
"""

from __future__ import annotations

import stat
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from jobdist.config import CouchSettings, DaemonSettings, SiteConfig
from jobdist.couch import Couch, Database
from jobdist.couch_sync import sync_design_docs
from jobdist.design import load_design_docs
from jobdist.journal import Held, Journal, JournalFull
from jobdist.lab.localserver import LocalServer, free_port
from jobdist.logs import EventLog
from jobdist.manager import Manager
from jobdist.model import Doc, new_job, new_step
from jobdist.step_run import StepResult
from jobdist.store import CouchStore

from .helpers import in_tmp, wait_for

LOG = EventLog("jobdist.journal", site="global")


def result(reason: str = "exit 0") -> StepResult:
    return StepResult(ok=True, used_alt=False, exit_code=0, attempts=1, exec_time=0.5,
                      start_time="2026-11-22T10:00:00.000000Z",
                      finish_time="2026-11-22T10:00:00.500000Z", stdout="out\n",
                      stderr="", reason=reason)


def held(job_id: str = "job-1", step: int = 0, epoch: int = 1, since: float = 1.0) -> Held:
    return Held(job_id, step, epoch, "global/w1", result(), since)


def test_a_kept_result_survives_a_restart_and_is_forgotten_once_written(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal")
    first, second = held("job-b", since=2.0), held("job/ä with odd id", step=3, since=1.0)
    second = replace(second, after="2026-11-22T09:59:59.000000Z")  # (core.follows)
    journal.keep(first)
    journal.keep(second)
    journal.keep(first)  # kept again (a retry): still one entry
    again = Journal(tmp_path / "journal")  # a daemon restarted
    assert again.load(LOG) == [second, first]  # oldest first, every field back
    again.forget(second)
    assert [entry.job_id for entry in Journal(tmp_path / "journal").load(LOG)] == ["job-b"]
    assert not list((tmp_path / "journal").glob(".*.tmp"))
    assert stat.S_IMODE((tmp_path / "journal").stat().st_mode) == 0o700


def test_the_journal_is_bounded(tmp_path: Path) -> None:
    journal = Journal(tmp_path, limit=2)
    journal.keep(held("a"))
    journal.keep(held("b"))
    journal.keep(held("b"))  # the same entry again takes no room
    with pytest.raises(JournalFull):
        journal.keep(held("c"))
    assert len(journal) == 2


def test_an_unreadable_entry_is_set_aside_not_fatal(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    journal = Journal(tmp_path)
    journal.keep(held("good"))
    (tmp_path / "broken-0-1.json").write_text("{not json")
    entries = Journal(tmp_path).load(LOG)
    assert [entry.job_id for entry in entries] == ["good"]
    assert (tmp_path / "broken-0-1.unreadable").exists()
    assert caplog.messages == [f"unreadable journal entry set aside site=global "
                               f"path={tmp_path / 'broken-0-1.json'} error="
                               f"'Expecting property name enclosed in double quotes: "
                               f"line 1 column 2 (char 1)'"]


# --- a real manager, a real server that dies mid-step -----------------------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalServer]:
    server = LocalServer(free_port(), tmp_path / "couch")  # on disk: a restart keeps the jobs
    server.start()
    try:
        yield server
    finally:
        server.stop()


def manager_for(server: LocalServer, journal_dir: Path) -> tuple[Manager, Database]:
    db = Couch(server.url, retries=2, retry_time=1.0).ensure_database("jobs")
    sync_design_docs(db, load_design_docs())
    config = SiteConfig("global", CouchSettings(server.url, "jobs"), workers=1,
                        daemon=DaemonSettings(lease=60.0))
    return Manager(in_tmp(config, journal_dir.parent), CouchStore(db), {"global"},
                   Journal(journal_dir)), db


def serve_until(manager: Manager, condition: object, what: str, timeout: float = 30.0) -> None:
    def served() -> bool:
        manager.serve_once(timeout=0.05)
        return bool(condition())  # type: ignore[operator]
    wait_for(served, timeout=timeout, what=what, interval=0)


def events(doc: Doc, name: str) -> list[Doc]:
    return [entry for entry in doc["history"] if entry["event"] == name]


def start_and_kill_server_mid_step(server: LocalServer, tmp_path: Path,
                                   second: str = "echo second") -> tuple[Manager, str]:
    manager, db = manager_for(server, tmp_path / "journal")
    # (The step ends before its start is due to be written alone (start_write_delay):
    # the end is planned on the revision the start was made on, with no read.)
    job = new_job("global", [new_step("sleep 0.5"), new_step(second)])
    db.save(job)
    manager.process(job["_id"])
    assert manager.pool.is_busy((job["_id"], 0)), "the creator starts its step at once"
    server.kill()  # CouchDB dies while the step runs
    serve_until(manager, lambda: manager.held, "the result to be held")
    # On disk: the end. The next step, chained onto it, waits for that write.
    assert manager.journal_status()["on_disk"] == 1
    assert manager.ledger.run((job["_id"], 1)) is None
    return manager, job["_id"]


def test_a_step_that_ends_while_couchdb_is_down_is_recorded_once_it_is_back(
        server: LocalServer, tmp_path: Path) -> None:
    manager, job_id = start_and_kill_server_mid_step(server, tmp_path)
    try:
        # The outage goes on: the result stays held, the step is not freed, and the
        # next step is not launched before its start is written with that end.
        until = time.monotonic() + 0.5
        serve_until(manager, lambda: time.monotonic() > until, "the outage to go on")
        assert manager.ledger.run((job_id, 0)) is not None and manager.held
        assert manager.ledger.run((job_id, 1)) is None
        server.start()
        db = Couch(server.url).database("jobs")
        serve_until(manager, lambda: db.get(job_id)["job_status"] == "success",
                    "the job to end")
    finally:
        manager.pool.shutdown(1.0)
    doc = db.get(job_id)
    assert [entry["step"] for entry in events(doc, "started")] == [0, 1]  # each once
    assert not events(doc, "released") and not events(doc, "stale_finish")
    assert doc["job"][0]["epoch"] == 1 and doc["job"][0]["output"]["stdout"] == ""
    assert doc["job"][1]["output"]["stdout"] == "second\n"
    assert manager.counts["results_held"] == 1 and manager.counts["results_replayed"] == 1
    assert manager.journal_status() == {"held": 0, "on_disk": 0, "oldest_seconds": None,
                                        "directory": str(tmp_path / "journal")}


def test_a_daemon_restarted_during_the_outage_writes_the_held_result_before_deciding(
        server: LocalServer, tmp_path: Path) -> None:
    manager, job_id = start_and_kill_server_mid_step(server, tmp_path)
    manager.drain(1.0)  # the daemon stops while CouchDB is still down
    assert manager.journal_status()["held"] == 1
    server.start()
    successor, db = manager_for(server, tmp_path / "journal")  # same journal, new process
    try:
        assert (job_id, 0) in successor.held
        successor.recover()  # would release the step as "worker lost" without the journal
        serve_until(successor, lambda: db.get(job_id)["job_status"] == "success",
                    "the job to end")
    finally:
        successor.pool.shutdown(1.0)
    doc = db.get(job_id)
    assert [entry["step"] for entry in events(doc, "started")] == [0, 1]
    assert not events(doc, "released")
    assert [entry["epoch"] for entry in events(doc, "finished")] == [1, 1]
    assert not list((tmp_path / "journal").glob("*.json"))


def test_a_held_result_whose_job_was_deleted_frees_its_worker(
        server: LocalServer, tmp_path: Path) -> None:
    """An operator deleted the job during the outage: its result has nothing left to be
    written in, and the worker it kept busy is free again."""
    manager, job_id = start_and_kill_server_mid_step(server, tmp_path)
    manager.drain(1.0)
    server.start()
    db = Couch(server.url).database("jobs")
    db.delete(job_id, db.get(job_id)["_rev"])
    successor, _ = manager_for(server, tmp_path / "journal")
    try:
        successor.recover()
        assert not successor.held and not successor.ledger.runs()
        assert len(successor.runner.free_workers()) == 1
        assert successor.counts["handler_errors"] == 0
    finally:
        successor.pool.shutdown(1.0)
    assert not list((tmp_path / "journal").glob("*.json"))

def test_a_held_result_whose_epoch_was_revoked_is_recorded_as_stale(
        server: LocalServer, tmp_path: Path) -> None:
    """Fencing still holds: a result held past a revocation never advances the job."""
    manager, job_id = start_and_kill_server_mid_step(server, tmp_path)
    server.start()
    db = Couch(server.url).database("jobs")
    revoked = db.get(job_id)
    step = revoked["job"][0]
    step.update(claimed_by=None, winner=None, executioner=None, step_status=None,
                start_time=None, lease_until=None, epoch=step["epoch"] + 1)
    db.save(revoked)  # as the creator's revocation in a new epoch would
    try:
        serve_until(manager, lambda: not manager.held, "the held result to be written")
    finally:
        manager.pool.shutdown(1.0)
    doc = db.get(job_id)
    stale = events(doc, "stale_finish")
    assert [(entry["step"], entry["epoch"]) for entry in stale if entry["step"] == 0] == [(0, 1)]
    assert all(entry["epoch"] != 1 for entry in events(doc, "finished"))
    assert doc["step"] == 0  # and the next step, never launched, never ran
    assert all(entry["step"] == 0 for entry in events(doc, "started"))
