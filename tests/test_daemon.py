"""The daemon's parts on a real pouchdb-server: listener, keep-alive, graceful stop."""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests

from jobdist.clock import format_time
from jobdist.couch import Couch, Database
from jobdist.couch_sync import sync_design_docs
from jobdist.design import load_design_docs
from jobdist.keepalive import KeepAlive
from jobdist.lab.localserver import LocalServer, free_port
from jobdist.listener import Changed, Listener
from jobdist.model import new_job, new_step
from jobdist.store import CouchStore

from .helpers import in_tmp, write_conflict


@pytest.fixture
def disk_server(tmp_path: Path) -> Iterator[LocalServer]:
    server = LocalServer(free_port(), tmp_path / "couch")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def jobs_db(server: LocalServer) -> Database:
    db = Couch(server.url).ensure_database("jobs")
    sync_design_docs(db, load_design_docs())
    return db


def take(inbox: queue.Queue[object], count: int, timeout: float = 10.0) -> list[Changed]:
    items = []
    deadline = time.monotonic() + timeout
    while len(items) < count:
        items.append(inbox.get(timeout=max(0.01, deadline - time.monotonic())))
    return items  # type: ignore[return-value]


def start_listener(db: Database, since: object) -> tuple[Listener, queue.Queue[object],
                                                          threading.Event]:
    inbox: queue.Queue[object] = queue.Queue(maxsize=5)  # small: back-pressure is exercised
    stop = threading.Event()
    listener = Listener(db, "global", inbox, since, stop, threading.Event(), heartbeat_ms=500)
    listener.start()
    return listener, inbox, stop


def test_listener_hands_over_changes_resumes_from_its_checkpoint_and_reconnects(
        disk_server: LocalServer) -> None:
    db = jobs_db(disk_server)
    first = [new_job("global", [new_step("true")]) for _ in range(12)]
    db.bulk_docs(first)
    listener, inbox, stop = start_listener(db, CouchStore(db).load_checkpoint("global"))
    try:
        seen = take(inbox, 12)  # more than the queue holds: the listener waited, lost nothing
        assert {item.doc_id for item in seen} == {job["_id"] for job in first}
        assert all(item.doc and item.doc["type"] == "job" for item in seen)
        CouchStore(db).save_checkpoint("global", seen[-1].seq)

        disk_server.kill()  # the server dies under the listener...
        disk_server.start()  # ...and comes back; the feed reconnects
        late = new_job("global", [new_step("true")])
        db.save(late)
        assert take(inbox, 1)[0].doc_id == late["_id"]
        assert listener.reconnects >= 1
    finally:
        stop.set()
        listener.join(5)

    # A new listener starts from the checkpoint: only what came after it.
    listener, inbox, stop = start_listener(db, CouchStore(db).load_checkpoint("global"))
    try:
        assert take(inbox, 1)[0].doc_id == late["_id"]
        with pytest.raises(queue.Empty):
            inbox.get(timeout=1.0)
    finally:
        stop.set()
        listener.join(5)


def test_keepalive_resaves_only_its_own_stale_open_jobs_and_only_their_timestamp(
        couch_server: LocalServer) -> None:
    db = Couch(couch_server.url).ensure_database(f"ka_{free_port()}")
    sync_design_docs(db, load_design_docs())
    long_ago = format_time(datetime.now(UTC) - timedelta(minutes=10))
    stale, fresh, claimed, foreign = (
        new_job("global", [new_step("true")], created_at=long_ago, priority=1),
        new_job("global", [new_step("true")]),
        new_job("global", [new_step("true")], created_at=long_ago),
        new_job("reg_a", [new_step("true")], created_at=long_ago),
    )
    claimed["job"][0]["claimed_by"] = "reg_a"
    db.bulk_docs([stale, fresh, claimed, foreign])
    keepalive = KeepAlive(db, "global", period=60, stale_after=5, stop=threading.Event(),
                          room=lambda: {"global": 1, "reg_a": None})

    assert keepalive.pass_once() == 1
    after = db.get(stale["_id"])
    assert after["_rev"].startswith("2-") and after["keepalive_at"] > long_ago
    changed = {k for k in after if after[k] != stale.get(k)} - {"_rev"}
    assert changed == {"keepalive_at"}
    for untouched in (fresh, claimed, foreign):
        assert db.get(untouched["_id"])["_rev"].startswith("1-")
    assert keepalive.pass_once() == 0  # just re-saved: not stale any more
    assert keepalive.resaved == 1


def test_keepalive_resaves_no_more_stale_jobs_than_sites_have_room_for(
        couch_server: LocalServer) -> None:
    db = Couch(couch_server.url).ensure_database(f"ka_{free_port()}")
    sync_design_docs(db, load_design_docs())
    minutes_ago = [format_time(datetime.now(UTC) - timedelta(minutes=m)) for m in (30, 20, 10)]
    # In line: the oldest first; the second may run at reg_a alone.
    first, for_a, last = (new_job("global", [new_step("true", target=target)], created_at=at)
                          for target, at in zip(("any", "reg_a", "any"), minutes_ago, strict=True))
    db.bulk_docs([first, for_a, last])
    room: dict[str, int | None] = {"global": 0, "reg_a": 0, "reg_b": 0}
    keepalive = KeepAlive(db, "global", period=60, stale_after=5, stop=threading.Event(),
                          room=lambda: room)

    assert keepalive.pass_once() == 0 and keepalive.left_for_room == 3  # every site busy
    room["reg_b"] = 1
    assert keepalive.pass_once() == 1 and keepalive.left_for_room == 2
    assert db.get(first["_id"])["_rev"].startswith("2-")  # the first in line reg_b may run
    room.update(reg_a=1, reg_b=1)
    assert keepalive.pass_once() == 2 and keepalive.left_for_room == 0
    assert [db.get(job["_id"])["_rev"][:2] for job in (first, for_a, last)] == ["2-", "2-", "2-"]


def test_sigterm_lets_the_daemon_release_its_running_step_and_exit_zero(
        disk_server: LocalServer, tmp_path: Path) -> None:
    db = jobs_db(disk_server)
    config = tmp_path / "global.toml"
    config.write_text(f'name = "global"\nworkers = 1\n\n[couch]\nurl = "{disk_server.url}"\n'
                      f'database = "jobs"\n\n[daemon]\nshutdown_grace = 0.5\n'
                      f'journal = "{tmp_path / "journal"}"\n\n[admin]\nport = 0\n')
    pid_file = tmp_path / "step.pid"
    job = new_job("global", [new_step(f"echo $$ > {pid_file}; exec sleep 60")])
    db.save(job)
    ready = tmp_path / "ready"
    daemon = subprocess.Popen(
        [sys.executable, "-m", "jobdist", "site", "run", "--config", str(config),
         "--ready-file", str(ready), "--log-file", str(tmp_path / "daemon.log"),
         "--log-level", "DEBUG"],
        start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline and daemon.poll() is None, "step never started"
            time.sleep(0.05)
        step_pid = int(pid_file.read_text())
        listening = re.search(r"admin endpoint listening site=global url=(\S+)",
                              (tmp_path / "daemon.log").read_text())
        assert listening and requests.get(f"{listening[1]}/status", timeout=5).ok  # logged too
        daemon.terminate()
        assert daemon.wait(30) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert not Path(f"/proc/{step_pid}").exists() or "Z" in Path(
        f"/proc/{step_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    doc = db.get(job["_id"])
    step = doc["job"][0]
    assert (step["step_status"], step["winner"], step["epoch"]) == (None, None, 2)
    released = doc["history"][-1]
    assert released["event"] == "released" and "stopped on this site" in released["detail"]
    log = (tmp_path / "daemon.log").read_text()
    assert "site stopped site=global" in log
    assert_one_line_an_event(log, "global")


LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) jobdist\.")


def assert_one_line_an_event(log: str, site: str) -> None:
    """docs/operations.md, "The daemon's log": every line is one event of jobdist's
    (no library's dump, nothing spread over lines), with the site, and a line about a
    job names its step."""
    for line in log.splitlines():
        assert LOG_LINE.match(line), line
        assert f" site={site}" in line, line
        assert " job=" not in line or " step=" in line, line


def test_a_malformed_job_is_logged_and_skipped_and_the_next_job_still_runs(
        couch_server: LocalServer, caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    from jobdist.config import CouchSettings, SiteConfig
    from jobdist.journal import Journal
    from jobdist.manager import Manager
    from jobdist.store import CouchStore

    # No design document yet: CouchDB cannot refuse the bad job, the daemon must cope.
    db = Couch(couch_server.url).ensure_database(f"bad_{free_port()}")
    bad = {"_id": "job-bad", "type": "job", "creator": "global", "job": "not a list"}
    good = new_job("global", [new_step("true")])
    db.bulk_docs([bad, good])
    manager = Manager(in_tmp(SiteConfig("global", CouchSettings(couch_server.url, db.name),
                                        workers=1), tmp_path),
                      CouchStore(db), {"global"}, Journal(tmp_path / "journal"))
    try:
        manager.process("job-bad")
        manager.process(good["_id"])
        deadline = time.monotonic() + 10
        while db.get(good["_id"])["job_status"] is None:
            assert time.monotonic() < deadline, "the good job never finished"
            manager.serve_once(timeout=0.1)
    finally:
        manager.pool.shutdown(1.0)
    assert manager.counts["invalid_documents"] == 1
    assert "invalid revision ignored job=job-bad" in caplog.text
    assert db.get("job-bad") == {**bad, "_rev": db.get("job-bad")["_rev"]}  # left as it was


def test_a_job_of_a_newer_format_is_left_alone_conflicts_and_all(
        couch_server: LocalServer, caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """A site not upgraded yet neither runs, merges nor cleans a newer release's job: it
    says so once and keeps every leaf as it came (docs/operations.md, "Upgrading")."""
    from jobdist.config import CouchSettings, SiteConfig
    from jobdist.journal import Journal
    from jobdist.manager import Manager
    from jobdist.model import JOB_FORMAT
    from jobdist.store import CouchStore

    db = Couch(couch_server.url).ensure_database(f"newer_{free_port()}")
    newer = {**new_job("global", [new_step("true")]), "_id": "job-next",
             "format": JOB_FORMAT + 1, "lanes": ["a later field"]}
    leaves = [{**newer, "_rev": "1-aaa"}, {**newer, "_rev": "1-bbb", "priority": 3}]
    write_conflict(db, leaves)
    manager = Manager(in_tmp(SiteConfig("global", CouchSettings(couch_server.url, db.name),
                                        workers=1), tmp_path),
                      CouchStore(db), {"global"}, Journal(tmp_path / "journal"))
    try:
        manager.process("job-next")
        for _ in range(5):
            manager.serve_once(timeout=0.1)
    finally:
        manager.pool.shutdown(1.0)
    assert sorted(leaf["_rev"] for leaf in db.leaves("job-next")) == ["1-aaa", "1-bbb"]
    assert db.get("job-next", rev="1-aaa") == leaves[0]
    assert f"format {JOB_FORMAT + 1} is newer than this jobdist reads" in caplog.text
    assert manager.counts["jobs_skipped"] == 1 and not manager.counts["invalid_documents"]
