"""Schedules: ticks in a time zone, the missed-tick policies, one job per tick
wherever it is made, the rules in Python and CouchDB alike, and the owner's
daemon making the jobs on real local sites."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from click.testing import CliRunner

from jobdist.cli import main
from jobdist.client import read_merged_many
from jobdist.clock import later, utc_now
from jobdist.couch import Couch
from jobdist.design import load_design_docs
from jobdist.document_rules import validate_schedule
from jobdist.lab.cluster import LocalCluster
from jobdist.lab.scenarios import site_db, wait_until_done, write_sites
from jobdist.model import Doc
from jobdist.schedules import (
    BadSchedule,
    Scheduler,
    due_ticks,
    new_schedule,
    tick_job,
    tick_job_id,
    ticks,
)
from jobdist.validation import format_errors, validate_job

from .test_validation import upload_design_docs

JOB = {"job": [{"do": "true"}]}


def schedule(**changes: Any) -> Doc:
    doc = new_schedule("nightly", "0 2 * * *", "global", JOB, now="2026-01-01T00:00:00Z")
    doc.update(changes)
    return doc


# --- ticks and policies (pure) -------------------------------------------------------


def test_ticks_follow_the_time_zone_through_daylight_saving() -> None:
    doc = schedule(cron="30 2 * * *", timezone="Europe/Zurich")
    found = list(ticks(doc, "2026-03-27T12:00:00Z", "2026-03-31T00:00:00Z"))
    # 02:30 CET is 01:30Z; on 29 March 02:30 does not exist and runs at 03:00 CEST (01:00Z).
    assert found == ["2026-03-28T01:30:00.000000Z", "2026-03-29T01:00:00.000000Z",
                     "2026-03-30T00:30:00.000000Z"]


LATE = ["2026-01-01T09:55:00.000000Z", "2026-01-01T09:56:00.000000Z",
        "2026-01-01T09:57:00.000000Z", "2026-01-01T09:58:00.000000Z",
        "2026-01-01T09:59:00.000000Z"]


@pytest.mark.parametrize(("policy", "caught_up"), [
    ("latest", LATE[-1:]), ("all", LATE), ("skip", []),
])
def test_missed_ticks_follow_the_schedules_policy(policy: str, caught_up: list[str]) -> None:
    # Looked at last at 09:54:30, now 10:00:30: the ticks 09:55-09:59 are more than
    # a minute late (the daemon was down), 10:00 is on time and always runs.
    doc = schedule(cron="* * * * *", missed=policy)
    due, skipped = due_ticks(doc, "2026-01-01T09:54:30Z", "2026-01-01T10:00:30Z")
    assert due == [*caught_up, "2026-01-01T10:00:00.000000Z"]
    assert skipped == len(LATE) - len(caught_up)


def test_a_tick_makes_the_same_valid_job_wherever_it_is_made() -> None:
    doc = schedule(job={"job": [{"do": "snapshot", "target": "reg_a"}], "priority": 3,
                        "meta": {"kind": "backup"}})
    tick = "2026-01-02T02:00:00.000000Z"
    first, second = tick_job(doc, tick), tick_job(doc, tick)
    assert first == second
    assert first["_id"] == tick_job_id("nightly", tick) == "job-20260102T020000.000000Z-nightly"
    assert (first["creator"], first["created_at"], first["priority"]) == ("global", tick, 3)
    assert first["schedule"] == {"name": "nightly", "tick": tick}
    assert first["meta"] == {"kind": "backup"}
    assert validate_job(first) == []


# --- rules ------------------------------------------------------------------------------


def test_a_new_schedule_is_valid() -> None:
    assert validate_schedule(schedule()) == []


@pytest.mark.parametrize(("changes", "message"), [
    ({"cron": "0 2 * *"}, "cron: must be a cron expression of 5 fields"),
    ({"timezone": "Europe/../etc"}, "timezone: must be an IANA time zone name"),
    ({"owner": "Global"}, "owner: must be a site name"),
    ({"missed": "never"}, 'missed: must be one of "latest", "all", "skip"'),
    ({"enabled": "yes"}, "enabled: must be true or false"),
    ({"job": {"job": []}}, "job.job: "),
    ({"job": "true"}, "job: must be an object: the job each tick submits"),
    ({"_id": "schedule-other"}, '_id: must be "schedule-" followed by the schedule\'s name'),
    ({"crom": "x"}, "crom: unknown field (did you mean 'cron'?)"),
    # What a tick's job would drop is refused, not lost.
    ({"job": {**JOB, "after": ["job-1"]}}, "job.after: not copied to the jobs of the ticks"),
    ({"job": {**JOB, "_id": "job-x"}}, "job._id: not copied to the jobs of the ticks"),
])
def test_each_schedule_rule_has_its_message(changes: Doc, message: str) -> None:
    problems = validate_schedule(schedule(**changes))
    assert any(message in problem for problem in problems), problems


@pytest.mark.parametrize(("cron", "zone", "message"), [
    ("61 * * * *", "UTC", "cron: '61 * * * *': bad minute"),
    ("0 2 * * *", "Mars/Olympus_Mons", "timezone: unknown time zone 'Mars/Olympus_Mons'"),
])
def test_python_also_reads_the_values(cron: str, zone: str, message: str) -> None:
    with pytest.raises(BadSchedule, match=message.replace("*", r"\*")):
        new_schedule("nightly", cron, "global", JOB, timezone=zone)


SCHEDULE_CORPUS = [
    {"cron": "0 2 * *"}, {"timezone": 5}, {"owner": "Global", "missed": "never"},
    {"job": {"job": [{"do": 1}], "priorty": 2}}, {"job": None}, {"name": "Nightly"},
    {"enabled": 1, "created_at": "yesterday"}, {"extra": True},
    {"job": {**JOB, "not_before": None, "history": [], "_rev": "1-a", "after": ["job-1"]}},
]


@pytest.mark.parametrize("changes", SCHEDULE_CORPUS)
def test_couchdb_refuses_bad_schedules_with_the_python_reason(db_url: str,
                                                              changes: Doc) -> None:
    upload_design_docs(db_url)
    doc = schedule(**changes)
    expected = validate_schedule(doc)
    assert expected
    response = requests.put(f"{db_url}/{doc['_id']}", json=doc, timeout=10)
    assert response.status_code == 403, response.text
    assert response.json()["reason"] == format_errors(expected)


def test_couchdb_takes_a_valid_schedule_and_a_tick_job(db_url: str) -> None:
    upload_design_docs(db_url)
    doc = schedule()
    assert requests.put(f"{db_url}/{doc['_id']}", json=doc, timeout=10).status_code == 201
    job = tick_job(doc, "2026-01-02T01:00:00.000000Z")
    assert requests.put(f"{db_url}/{job['_id']}", json=job, timeout=10).status_code == 201


# --- on real sites ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("schedules")
    with LocalCluster(write_sites(root / "sites", 3), root / "state", in_memory=True) as local:
        yield local


def cli(cluster: LocalCluster, *args: str) -> str:
    result = CliRunner().invoke(main, [*args, "--sites", str(cluster.sites_dir)])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.e2e
def test_the_owner_makes_the_missed_and_due_ticks_jobs(cluster: LocalCluster) -> None:
    """A schedule every minute, changed 3.5 minutes ago with `missed = all`: the owner
    makes a job for each tick since, the jobs run, and each tick is one job even when
    another site makes the same tick too."""
    changed = later(utc_now(), -210)
    doc = new_schedule("every-minute", "* * * * *", "reg_a",
                       {"job": [{"do": "echo tick", "target": "reg_b"}]},
                       missed="all", now=changed)
    # The tick before the change never runs; a duplicate of one tick made at global.
    expected = list(ticks(doc, changed, utc_now()))
    assert len(expected) >= 3
    site_db(cluster, "reg_a").save(doc)
    site_db(cluster, "global").save(tick_job(doc, expected[0]))
    ids = [tick_job_id("every-minute", tick) for tick in expected]
    ended = wait_until_done(site_db(cluster, "global"), ids, timeout=90)
    assert {job["job_status"] for job in ended} == {"success"}
    # The ends reach the creator by replication, maybe after global: read them there.
    wait_until_done(site_db(cluster, "reg_a"), ids, timeout=30)
    merged = read_merged_many(site_db(cluster, "reg_a"), ids)
    for job_id, job in merged.items():
        assert job["creator"] == "reg_a" and job["schedule"]["name"] == "every-minute"
        started = [e for e in job["history"] if e["event"] == "started"]
        assert len(started) == 1, (job_id, job["history"])
    before = later(changed, -60)
    assert site_db(cluster, "global").get(tick_job_id("every-minute", before)) is None


@pytest.mark.e2e
def test_the_schedule_commands(cluster: LocalCluster) -> None:
    added = cli(cluster, "schedule", "add", "nightly", "--cron", "0 2 * * *", "--timezone",
                "Europe/Zurich", "--owner", "reg_b", "--step", "snapshot", "--target",
                "reg_b", "--site", "global")
    assert "added schedule nightly: reg_b makes its job at 0 2 * * * (Europe/Zurich)" in added
    assert "nightly" in cli(cluster, "schedule", "list", "--site", "global")
    assert "0 2 * * * (Europe/Zurich), owner reg_b, enabled" in cli(
        cluster, "schedule", "show", "nightly", "--site", "global")
    assert cli(cluster, "schedule", "pause", "nightly", "--site", "global") == \
        "paused schedule nightly\n"
    assert "paused" in cli(cluster, "schedule", "list", "--site", "global")
    cli(cluster, "schedule", "resume", "nightly", "--site", "global")
    cli(cluster, "schedule", "remove", "nightly", "--site", "global")
    missing = CliRunner().invoke(main, ["schedule", "show", "nightly", "--sites",
                                        str(cluster.sites_dir), "--site", "global"])
    assert (missing.exit_code, missing.output) == (
        2, "jobdist: no schedule 'nightly' at site global\n")


def test_bad_schedules_are_one_line_each_at_the_cli(tmp_path: Any) -> None:
    sites = write_sites(tmp_path / "sites", 1)
    result = CliRunner().invoke(main, ["schedule", "add", "x", "--cron", "61 * * * *",
                                       "--step", "true", "--sites", str(sites)])
    assert result.exit_code == 2
    assert result.output == "jobdist: cron: '61 * * * *': bad minute\n"


def test_a_malformed_schedule_never_stops_the_others(db_url: str) -> None:
    """Schedules written where validation was off (then replicated here): each bad one is
    skipped, the owner still makes the good one's jobs."""
    for design in load_design_docs():
        design.pop("validate_doc_update", None)
        requests.put(f"{db_url}/{design['_id']}", json=design, timeout=10).raise_for_status()
    good = new_schedule("good", "* * * * *", "global", JOB, missed="all",
                        now=later(utc_now(), -150))
    nameless = {key: value for key, value in good.items() if key != "name"}
    bad = [nameless | {"_id": "schedule-nameless"}, good | {"_id": "schedule-x", "name": 5},
           good | {"_id": "schedule-typeless", "name": "typeless", "cron": 5}]
    for doc in [*bad, good]:
        assert requests.put(f"{db_url}/{doc['_id']}", json=doc, timeout=10).status_code == 201
    # Nested deeper than Python's JSON parser reads.
    text = json.dumps(good | {"_id": "schedule-deep", "name": "deep"})
    assert requests.put(f"{db_url}/schedule-deep", data=text[:-1] + ', "x": ' + "[" * 1500
                        + "]" * 1500 + "}", timeout=10,
                        headers={"Content-Type": "application/json"}).status_code == 201
    db = Couch(db_url.rsplit("/", 1)[0]).database(db_url.rsplit("/", 1)[1])
    reports = Scheduler(db, "global", threading.Event()).pass_once()
    assert list(reports) == ["good"] and reports["good"].created
