"""Retention (`jobdist cleanup`, jobdist/retention.py) on a real server, no daemons."""

from __future__ import annotations

import copy
import io
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner, Result

from jobdist.cli import main
from jobdist.clock import DurationError, format_time, parse_duration
from jobdist.couch import Couch, Database, Saved
from jobdist.lab.localserver import LocalServer
from jobdist.model import Doc, new_job, new_step
from jobdist.retention import (
    cleanup,
    delete_jobs,
    export_jobs,
    find_expired,
)

NOW = datetime.now(UTC)


def at(days_ago: float) -> str:
    return format_time(NOW - timedelta(days=days_ago))


def job(name: str, updated: str, status: str | None = "success") -> Doc:
    doc = new_job("global", [new_step(f"echo {name}")], created_at=updated,
                  job_id=f"job-{name}")
    doc["job_status"] = status
    if status == "success":
        doc["step"] = 1
        doc["job"][0]["step_status"] = "finished"
    return doc


@pytest.fixture
def site(couch_server: LocalServer, tmp_path: Path) -> Iterator[tuple[Path, Database]]:
    """A one-site sites directory on the session server, set up by `jobdist setup`."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "global.toml").write_text(
        f'name = "global"\n[couch]\nurl = "{couch_server.url}"\ndatabase = "{name}"\n')
    result = run(sites, "setup")
    assert result.exit_code == 0, result.output
    db = Couch(couch_server.url).database(name)
    try:
        yield sites, db
    finally:
        requests.delete(db.url, timeout=10)


def run(sites: Path, *args: str) -> Result:
    result = CliRunner(env={"JOBDIST_SITES": str(sites), "JOBDIST_SITE": None}).invoke(
        main, list(args))
    assert "Traceback" not in result.output
    return result


def conflict(db: Database, leaves: list[Doc]) -> None:
    body = {"new_edits": False, "docs": leaves}
    requests.post(f"{db.url}/_bulk_docs", json=body, timeout=10).raise_for_status()


def populate(db: Database) -> set[str]:
    """Jobs of every kind; the ids of those expired at 30 days."""
    same = at(60)
    docs = [
        job("old-success", at(90)),
        job("old-failed", at(80), "failed"),
        job("old-cancelled-1", same, "cancelled"),
        job("old-cancelled-2", same, "cancelled"),  # same instant: one view key, two rows
        job("old-cancelled-3", same, "cancelled"),
        job("recent-success", at(1)),
        job("old-but-live", at(90), None),
    ]
    db.bulk_docs(docs)
    # Two old leaves of one finished job: both go.
    first = job("old-conflicted", at(70))
    second = copy.deepcopy(first)
    second["history"].append({**first["history"][0], "event": "finished"})
    first["_rev"], second["_rev"] = "1-" + "a" * 32, "1-" + "b" * 32
    # CouchDB's winner is old, but another leaf was updated yesterday: the merge is not expired.
    winner = job("old-winner-recent-leaf", at(70))
    other = copy.deepcopy(winner)
    other["updated_at"] = at(1)
    winner["_rev"], other["_rev"] = "1-" + "f" * 32, "1-" + "0" * 32
    conflict(db, [first, second, winner, other])
    return {"job-old-success", "job-old-failed", "job-old-cancelled-1", "job-old-cancelled-2",
            "job-old-cancelled-3", "job-old-conflicted"}


@pytest.mark.parametrize(("text", "seconds"), [
    ("90m", 5400), ("12h", 43200), ("30d", 30 * 86400), ("2w", 14 * 86400), ("45s", 45),
    ("1d12h", 129600), ("1.5h", 5400),
])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["", "30", "d", "3x", "30 days", "-1d", "0d", "1d-2h"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)


def test_find_expired_pages_through_the_view(site: tuple[Path, Database]) -> None:
    _, db = site
    expected = populate(db)
    cutoff = at(30)
    # Windows of 2 and pages of 1: the three jobs of one instant still come once each.
    found = list(find_expired(db, cutoff, window=2, page_size=1))
    assert sorted(job.id for job in found) == sorted(expected)
    assert [job.doc["updated_at"] for job in found] == sorted(j.doc["updated_at"] for j in found)
    conflicted = next(job for job in found if job.id == "job-old-conflicted")
    assert sorted(conflicted.revs) == ["1-" + "a" * 32, "1-" + "b" * 32]
    assert [h["event"] for h in conflicted.doc["history"]] == ["created", "finished"]


def test_dry_run_deletes_nothing(site: tuple[Path, Database], tmp_path: Path) -> None:
    sites, db = site
    expected = populate(db)
    before = {row["id"]: row["value"]["rev"] for row in db.all_docs()}
    export = tmp_path / "export.jsonl"
    result = run(sites, "cleanup", "--older-than", "30d", "--dry-run", "--export", str(export))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"would remove {len(expected)} finished jobs last updated "
                                    "before ")
    assert "(dry run: nothing changed)" in result.stdout
    assert {row["id"]: row["value"]["rev"] for row in db.all_docs()} == before
    assert not export.exists()


def test_cleanup_exports_then_deletes(site: tuple[Path, Database], tmp_path: Path) -> None:
    sites, db = site
    expected = populate(db)
    export = tmp_path / "export.jsonl"
    export.write_text('{"_id": "from-an-earlier-run"}\n')
    result = run(sites, "cleanup", "--older-than", "30d", "--export", str(export))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"exported {len(expected)} jobs to {export}",
        f"removed {len(expected)} of {len(expected)} finished jobs last updated before "
        f"{result.stdout.split('before ')[1].split(' UTC')[0]} UTC at site global "
        f"({len(expected) + 1} revisions)",
    ]
    lines = [json.loads(line) for line in export.read_text().splitlines()]
    assert lines[0] == {"_id": "from-an-earlier-run"}  # appended, never overwritten
    exported = {doc["_id"]: doc for doc in lines[1:]}
    assert set(exported) == expected
    assert exported["job-old-failed"]["job_status"] == "failed"
    assert len(exported["job-old-conflicted"]["history"]) == 2  # the merge of both leaves
    for doc_id in expected:
        assert db.leaves(doc_id) == [] and db.get(doc_id) is None
    remaining = {row["id"] for row in db.all_docs() if not row["id"].startswith("_design/")}
    assert remaining == {"job-recent-success", "job-old-but-live", "job-old-winner-recent-leaf"}
    again = run(sites, "cleanup", "--older-than", "30d")
    assert again.stdout.startswith("removed 0 of 0 finished jobs")


def test_only_what_was_read_is_deleted(site: tuple[Path, Database]) -> None:
    _, db = site
    populate(db)
    found = list(find_expired(db, at(30)))
    out = io.StringIO()
    assert export_jobs(found, out) == found
    assert len(out.getvalue().splitlines()) == len(found)
    # Someone writes to one job after it was read and exported: it stays.
    changed = db.get("job-old-success")
    assert isinstance(db.save({**changed, "priority": 5}), Saved)
    result = delete_jobs(db, found)
    assert result.changed == ["job-old-success"]
    assert result.jobs == len(found) - 1
    assert db.get("job-old-success")["priority"] == 5
    assert db.get("job-old-failed") is None


def test_cleanup_function_for_the_daemon(site: tuple[Path, Database]) -> None:
    _, db = site
    expected = populate(db)
    report = cleanup(db, timedelta(days=30), dry_run=True)
    assert (report.found, report.deleted.jobs) == (len(expected), 0)
    assert cleanup(db, timedelta(days=30), dry_run=True, creator="reg_a").found == 0
    # From 100 days in the future, everything finished is older than 30 days.
    report = cleanup(db, timedelta(days=30), now=NOW + timedelta(days=100), batch=2)
    assert report.found == report.deleted.jobs == len(expected) + 2
    remaining = {row["id"] for row in db.all_docs() if not row["id"].startswith("_design/")}
    assert remaining == {"job-old-but-live"}


def test_the_daemons_periodic_cleanup_removes_only_its_own_old_jobs(
        site: tuple[Path, Database], tmp_path: Path) -> None:
    import threading

    from jobdist.retention import PeriodicCleanup

    _, db = site
    mine_old, mine_new, theirs_old, live_old = (
        job("mine-old", at(40)), job("mine-new", at(1)), job("theirs-old", at(40)),
        job("live-old", at(40), status=None))
    theirs_old["creator"] = "reg_a"
    db.bulk_docs([mine_old, mine_new, theirs_old, live_old])
    export = tmp_path / "removed.jsonl"
    runner = PeriodicCleanup(db, mine_old["creator"], timedelta(days=30), 3600, export,
                             threading.Event())
    report = runner.pass_once()
    assert report.deleted.jobs == 1
    assert db.get(mine_old["_id"]) is None
    for kept in (mine_new, theirs_old, live_old):
        assert db.get(kept["_id"]) is not None
    assert [json.loads(line)["_id"] for line in export.read_text().splitlines()] == [
        mine_old["_id"]]
