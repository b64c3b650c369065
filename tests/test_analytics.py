"""`jobdist report` on local[2] against a real pouchdb-server holding hand-made jobs.

Every job below has known timestamps (seconds after T0), so each figure the
pipeline computes is checked against arithmetic written out here.
"""

from __future__ import annotations

import csv
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from click.testing import CliRunner, Result

pytest.importorskip("pyspark")
pytest.importorskip("matplotlib")

from jobdist.analytics import page, source, tables
from jobdist.analytics.source import CouchSource
from jobdist.cli import main
from jobdist.clock import format_time
from jobdist.config import write_credentials
from jobdist.couch import Couch, Database, Saved
from jobdist.couch_sync import sync_design_docs
from jobdist.design import load_design_docs
from jobdist.lab.localserver import LocalServer, free_port
from jobdist.model import Doc, Reason, event, new_job, new_step

pytestmark = pytest.mark.spark

T0 = datetime(2026, 1, 1, tzinfo=UTC)
WORKERS = 2
ADMIN = ("admin", "admin-pw-of-the-test")
ALT_DO_DETAIL = "alt_do succeeded after do failed (exit 1 after 1 attempt)"
FAILURE_REASON = "exit 1 after 2 attempts"


def at(seconds: float) -> str:
    return format_time(T0 + timedelta(seconds=seconds))


def ran(step: Doc, site: str, start: float, finish: float, *, attempts: int = 1,
        exit_code: int = 0, status: str = "finished") -> None:
    step.update(epoch=1, claimed_by=site, winner=site, executioner=f"{site}/w1",
                step_status=status, exec_time=round(finish - start, 6), start_time=at(start),
                finish_time=at(finish), attempts=attempts, exit_code=exit_code)


def job(name: str, created: float, targets: list[str], status: str | None) -> Doc:
    steps = [new_step(f"step {i}", target=t, alt_do="true") for i, t in enumerate(targets)]
    doc = new_job("global", steps, created_at=at(created), job_id=f"job-{name}")
    doc["job_status"] = status
    doc["step"] = len(targets) if status == "success" else 0
    return doc


def log(doc: Doc, name: str, step: int, site: str, seconds: float,
        detail: str | None = None, reason: Reason | None = None) -> None:
    doc["history"].append(event(name, step=step, site=site, at=at(seconds),
                                worker=f"{site}/w1", epoch=1, detail=detail, reason=reason))


def job_a() -> Doc:
    """3 steps on reg_a, reg_b, reg_a; one claim, won."""
    doc = job("a", 0.0, ["any", "reg_b", "reg_a"], "success")
    ran(doc["job"][0], "reg_a", 0.5, 2.5)
    ran(doc["job"][1], "reg_b", 3.0, 4.0)
    ran(doc["job"][2], "reg_a", 4.2, 5.2)
    log(doc, "claimed", 0, "reg_a", 0.2)
    log(doc, "won", 0, "global", 0.3, "winner reg_a")
    for step, (start, finish) in enumerate([(0.5, 2.5), (3.0, 4.0), (4.2, 5.2)]):
        site = doc["job"][step]["winner"]
        log(doc, "started", step, site, start)
        log(doc, "finished", step, site, finish, "exit 0 after 1 attempt")
    return doc


def job_b() -> Doc:
    """2 steps; reg_a loses the claim on step 0; step 1 is saved by alt_do."""
    doc = job("b", 1.0, ["any", "any"], "success")
    ran(doc["job"][0], "reg_b", 1.4, 4.4)
    ran(doc["job"][1], "reg_a", 5.0, 7.0, attempts=2)
    log(doc, "claimed", 0, "reg_a", 1.1)
    log(doc, "claimed", 0, "reg_b", 1.1)
    log(doc, "won", 0, "global", 1.2, "winner reg_b")
    log(doc, "started", 0, "reg_b", 1.4)
    log(doc, "finished", 0, "reg_b", 4.4, "exit 0 after 1 attempt")
    log(doc, "claimed", 1, "reg_a", 4.6)
    log(doc, "won", 1, "global", 4.8, "winner reg_a")
    log(doc, "started", 1, "reg_a", 5.0)
    log(doc, "finished", 1, "reg_a", 7.0, ALT_DO_DETAIL, Reason.ALT_DO)
    return doc


def job_c() -> Doc:
    """Fails at step 1 on reg_b after one retry; step 2 never runs."""
    doc = job("c", 2.0, ["reg_a", "reg_b", "any"], "failed")
    doc["step"] = 1
    ran(doc["job"][0], "reg_a", 2.5, 3.5)
    ran(doc["job"][1], "reg_b", 3.6, 6.6, attempts=2, exit_code=1, status="failed")
    doc["job"][1]["progress"] = {"fraction": 0.25, "message": "copying volume 1", "at": at(5.0)}
    log(doc, "started", 0, "reg_a", 2.5)
    log(doc, "finished", 0, "reg_a", 3.5, "exit 0 after 1 attempt")
    log(doc, "started", 1, "reg_b", 3.6)
    log(doc, "retried", 1, "reg_b", 4.6, "attempt 1: exit 1; retry 1 in 1 s")
    log(doc, "failed", 1, "reg_b", 6.6, FAILURE_REASON)
    return doc


def job_d() -> Doc:
    """2 steps, both on reg_b, started without claims."""
    doc = job("d", 3.0, ["reg_b", "reg_b"], "success")
    ran(doc["job"][0], "reg_b", 3.1, 4.1)
    ran(doc["job"][1], "reg_b", 4.5, 5.0)
    return doc


def job_e() -> Doc:
    """Live: created, nothing ran yet: it waits for a job that is not there."""
    doc = job("e", 6.0, ["any"], None)
    doc["after"] = ["job-not-there"]
    return doc


# Revisions each job ends with: the number of times it is written.
REVISIONS = {"job-a": 5, "job-b": 3, "job-c": 4, "job-d": 1, "job-e": 2}


def write_jobs(database: Database) -> None:
    """Write each job REVISIONS times with _bulk_docs, plus a document that is no job."""
    docs = {doc["_id"]: doc for doc in (job_a(), job_b(), job_c(), job_d(), job_e())}
    database.bulk_docs([{"_id": "settings", "type": "settings"}])
    for round_number in range(max(REVISIONS.values())):
        batch = [doc for doc_id, doc in docs.items() if REVISIONS[doc_id] > round_number]
        for doc, result in zip(batch, database.bulk_docs(batch), strict=True):
            assert isinstance(result, Saved), result
            doc["_rev"] = result.rev
    add_views(database)


def add_views(database: Database) -> None:
    """The design documents `jobdist setup` uploads: the report lists jobs with a view.
    Uploaded last, so that their validation does not judge what the test wrote."""
    sync_design_docs(database, load_design_docs())


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    session = source.start_spark("local[2]", tmp_path_factory.mktemp("spark") / "spark.log")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def jobs_db(couch_server: LocalServer) -> Iterator[str]:
    """The name of a database on the session server holding the five jobs."""
    name = f"t_analytics_{uuid.uuid4().hex[:8]}"
    write_jobs(Couch(couch_server.url).ensure_database(name))
    try:
        yield name
    finally:
        requests.delete(f"{couch_server.url}/{name}", timeout=10)


@pytest.fixture(scope="module")
def result(spark: Any, couch_server: LocalServer, jobs_db: str,
           tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("report")
    return page.run_report(CouchSource(couch_server.url, jobs_db), out, "local[2]",
                           WORKERS), out


def rows_by(spark: Any, out: Path, table: str, *key: str) -> dict:
    rows = spark.read.parquet(str(out / f"{table}.parquet")).collect()
    return {tuple(row[k] for k in key) if len(key) > 1 else row[key[0]]: row for row in rows}


# -- per job -------------------------------------------------------------------------


def test_jobs_makespan_ideal_and_revisions(spark: Any, result: tuple[dict, Path]) -> None:
    jobs = rows_by(spark, result[1], "jobs", "job_id")
    assert set(jobs) == {"job-a", "job-b", "job-c", "job-d", "job-e"}  # not "settings"
    expected = {  # first start -> last finish, created -> last finish, sum of exec_time
        "job-a": (5.2 - 0.5, 5.2 - 0.0, 2.0 + 1.0 + 1.0),
        "job-b": (7.0 - 1.4, 7.0 - 1.0, 3.0 + 2.0),
        "job-c": (6.6 - 2.5, 6.6 - 2.0, 1.0 + 3.0),
        "job-d": (5.0 - 3.1, 5.0 - 3.0, 1.0 + 0.5),
    }
    for job_id, (makespan, turnaround, ideal) in expected.items():
        row = jobs[job_id]
        assert row["makespan_s"] == pytest.approx(makespan)
        assert row["turnaround_s"] == pytest.approx(turnaround)
        assert row["ideal_s"] == pytest.approx(ideal)
        assert row["makespan_ratio"] == pytest.approx(makespan / ideal)
        assert row["waiting_s"] == pytest.approx(turnaround - ideal)
    live = jobs["job-e"]
    assert (live["status"], live["makespan_s"], live["ideal_s"], live["makespan_ratio"]) == (
        "live", None, 0.0, None)
    for job_id, revisions in REVISIONS.items():
        assert jobs[job_id]["revisions"] == revisions
        assert jobs[job_id]["revisions_per_step"] == pytest.approx(
            revisions / jobs[job_id]["steps"])


def test_jobs_status_attempts_retries_and_claims(spark: Any, result: tuple[dict, Path]) -> None:
    jobs = rows_by(spark, result[1], "jobs", "job_id")
    figures = {job_id: (row["status"], row["steps"], row["steps_run"], row["attempts"],
                        row["retries"], row["claims"], row["lost_claims"], row["alt_do_steps"])
               for job_id, row in jobs.items()}
    assert figures == {
        "job-a": ("success", 3, 3, 3, 0, 1, 0, 0),
        "job-b": ("success", 2, 2, 1 + 2, 0, 3, 3 - 2, 1),
        "job-c": ("failed", 3, 2, 1 + 2, 1, 0, 0, 0),
        "job-d": ("success", 2, 2, 2, 0, 0, 0, 0),
        "job-e": ("live", 1, 0, 0, 0, 0, 0, 0),
    }
    assert jobs["job-d"]["targeted_steps"] == 2 and jobs["job-b"]["targeted_steps"] == 0


# -- per step ------------------------------------------------------------------------


def test_steps_overhead_from_runnable_to_start(spark: Any, result: tuple[dict, Path]) -> None:
    steps = rows_by(spark, result[1], "steps", "job_id", "step")
    expected = {  # start minus created_at (step 0) or minus the previous step's finish
        ("job-a", 0): 0.5 - 0.0, ("job-a", 1): 3.0 - 2.5, ("job-a", 2): 4.2 - 4.0,
        ("job-b", 0): 1.4 - 1.0, ("job-b", 1): 5.0 - 4.4,
        ("job-c", 0): 2.5 - 2.0, ("job-c", 1): 3.6 - 3.5, ("job-c", 2): None,
        ("job-d", 0): 3.1 - 3.0, ("job-d", 1): 4.5 - 4.1,
        ("job-e", 0): None,
    }
    assert set(steps) == set(expected)
    for key, overhead in expected.items():
        assert steps[key]["overhead_s"] == (pytest.approx(overhead) if overhead else None), key


def test_steps_site_attempts_exit_code_and_alt_do(spark: Any, result: tuple[dict, Path]) -> None:
    steps = rows_by(spark, result[1], "steps", "job_id", "step")
    figures = {key: (row["site"], row["status"], row["attempts"], row["retries"],
                     row["exit_code"], row["alt_do_used"]) for key, row in steps.items()}
    assert figures[("job-b", 1)] == ("reg_a", "finished", 2, 0, 0, True)
    assert figures[("job-c", 1)] == ("reg_b", "failed", 2, 1, 1, False)
    assert figures[("job-c", 2)] == (None, None, 0, 0, None, False)
    assert figures[("job-a", 1)] == ("reg_b", "finished", 1, 0, 0, False)
    progress = {key: (row["progress"], row["progress_message"]) for key, row in steps.items()}
    assert progress[("job-c", 1)] == (0.25, "copying volume 1")  # the last value, kept
    assert progress[("job-c", 0)] == (None, None)
    assert steps[("job-b", 0)]["exec_time_s"] == pytest.approx(3.0)
    assert steps[("job-b", 1)]["runnable_at"] == steps[("job-b", 0)]["finish_time"]


# -- per site, failures, summary -------------------------------------------------------


WINDOW = 7.0 - 0.5  # first start anywhere (job-a step 0) to last finish (job-b step 1)
SITES = {  # steps, busy seconds, retries, failures, alt_do steps, overhead p50
    "reg_a": (4, 2.0 + 1.0 + 2.0 + 1.0, 0, 0, 1, 0.5),  # a0 a2 b1 c0
    "reg_b": (5, 1.0 + 3.0 + 3.0 + 1.0 + 0.5, 1, 1, 0, 0.4),  # a1 b0 c1 d0 d1
}


def test_sites_busy_time_and_utilisation(spark: Any, result: tuple[dict, Path]) -> None:
    sites = rows_by(spark, result[1], "sites", "site")
    assert set(sites) == set(SITES)
    for site, (steps, busy, retries, failures, alt_do, p50) in SITES.items():
        row = sites[site]
        assert (row["steps"], row["retries"], row["failures"], row["alt_do_steps"]) == (
            steps, retries, failures, alt_do)
        assert row["busy_s"] == pytest.approx(busy)
        assert row["window_s"] == pytest.approx(WINDOW)
        assert row["utilisation"] == pytest.approx(busy / (WORKERS * WINDOW))
        assert row["overhead_p50_s"] == pytest.approx(p50)


def test_failures_with_reasons(spark: Any, result: tuple[dict, Path]) -> None:
    failures = spark.read.parquet(str(result[1] / "failures.parquet")).collect()
    assert [(f["job_id"], f["step"], f["site"], f["reason"]) for f in failures] == [
        ("job-c", 1, "reg_b", FAILURE_REASON)]


def test_summary_figures(result: tuple[dict, Path]) -> None:
    summary = result[0]
    assert (summary["jobs"], summary["steps"], summary["steps_run"]) == (5, 3 + 2 + 3 + 2 + 1, 9)
    assert summary["status"] == {"success": 3, "failed": 1, "live": 1}
    assert (summary["lost_claims"], summary["retries"], summary["failures"]) == (1, 1, 1)
    assert summary["failure_reasons"] == {FAILURE_REASON: 1}
    assert summary["alt_do_steps"] == 1
    # Makespans sorted 1.9 4.1 4.7 5.6; percentiles interpolate between neighbours.
    assert summary["makespan_s"]["p50"] == pytest.approx((4.1 + 4.7) / 2)
    assert summary["makespan_s"]["p95"] == pytest.approx(4.7 + 0.85 * (5.6 - 4.7))
    # Overheads sorted 0.1 0.1 0.2 0.4 0.4 0.5 0.5 0.5 0.6: p50 the 5th, p95 at 7.6 of 8.
    assert summary["overhead_s"]["p50"] == pytest.approx(0.4)
    assert summary["overhead_s"]["p95"] == pytest.approx(0.5 + 0.6 * (0.6 - 0.5))
    revisions = summary["revisions_per_job"]
    assert (revisions["min"], revisions["max"]) == (1, 5)
    assert revisions["mean"] == pytest.approx((5 + 3 + 4 + 1 + 2) / 5)
    assert summary["revisions_per_step"] == pytest.approx((5 / 3 + 3 / 2 + 4 / 3 + 1 / 2 + 2) / 5)
    assert summary["window_s"] == pytest.approx(WINDOW)
    assert summary["sites"]["reg_b"]["utilisation"] == pytest.approx(8.5 / (WORKERS * WINDOW))


# -- outputs ---------------------------------------------------------------------------


def test_parquet_and_csv_tables_read_back(spark: Any, result: tuple[dict, Path]) -> None:
    out = result[1]
    expected_rows = {"jobs": 5, "steps": 11, "sites": 2, "failures": 1, "broadcasts": 0}
    for table in tables.TABLES:
        parquet = spark.read.parquet(str(out / f"{table}.parquet"))
        with (out / f"{table}.csv").open(newline="") as handle:
            reader = csv.DictReader(handle)
            rows = list(reader)
        assert len(rows) == parquet.count()
        assert reader.fieldnames == parquet.columns
        if table in expected_rows:
            assert len(rows) == expected_rows[table]
    jobs_csv = {row["job_id"]: row for row in csv.DictReader((out / "jobs.csv").open())}
    assert float(jobs_csv["job-a"]["makespan_s"]) == pytest.approx(4.7)
    assert jobs_csv["job-a"]["created_at"] == at(0.0)  # the documents' own time format
    assert not list(out.glob(".*.parts"))


def test_html_report_is_self_contained(result: tuple[dict, Path]) -> None:
    summary, out = result
    html_page = (out / "report.html").read_text()
    assert html_page.count('src="data:image/png;base64,') == 4
    assert "<script" not in html_page and "<link" not in html_page and 'src="http' not in html_page
    utilisation_a, utilisation_b = 6.0 / (WORKERS * WINDOW), 8.5 / (WORKERS * WINDOW)
    for text in ("5 (3 success, 1 failed, 1 live)", "9 of 11", "4.400 s / 5.465 s",
                 "0.400 s / 0.560 s", FAILURE_REASON, f"{utilisation_a:.1%}",
                 f"{utilisation_b:.1%}"):
        assert text in html_page, text
    assert summary["report"] == str(out / "report.html")


def test_empty_database(spark: Any, db_url: str, tmp_path: Path) -> None:
    couch_url, _, name = db_url.rpartition("/")
    add_views(Couch(couch_url).database(name))
    summary = page.run_report(CouchSource(couch_url, name), tmp_path, "local[2]")
    assert (summary["jobs"], summary["steps"], summary["sites"]) == (0, 0, {})
    assert summary["makespan_s"]["p50"] is None
    assert "data:image/png;base64," in (tmp_path / "report.html").read_text()


def test_executors_fetch_in_partitions(spark: Any, couch_server: LocalServer, jobs_db: str,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source, "IDS_PER_PARTITION", 2)
    ids = sorted(source.list_job_ids(Couch(couch_server.url).database(jobs_db), page_size=2))
    assert ids == ["job-a", "job-b", "job-c", "job-d", "job-e"]
    raw = source.load_jobs(spark, CouchSource(couch_server.url, jobs_db), ids)
    assert raw.rdd.getNumPartitions() == 3
    assert sorted(row["job_id"] for row in raw.collect()) == ids


def test_executor_fetch_failure_is_one_line(spark: Any, couch_server: LocalServer,
                                            tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    database = Couch(couch_server.url).ensure_database(f"t_gone_{uuid.uuid4().hex[:8]}")
    write_jobs(database)
    list_ids = source.list_job_ids

    def list_then_drop(db: Database, page_size: int = source.ID_PAGE) -> list[str]:
        ids = list_ids(db, page_size)
        requests.delete(db.url, timeout=10).raise_for_status()  # gone before the executors read
        return ids

    monkeypatch.setattr(page, "list_job_ids", list_then_drop)
    with pytest.raises(source.ReportError) as failure:
        page.run_report(CouchSource(couch_server.url, database.name), tmp_path, "local[2]")
    message = str(failure.value)
    assert "\n" not in message and message.startswith("read documents in "), message
    assert "HTTP 404" in message


def test_job_row_is_lenient() -> None:
    doc = job_d() | {"_rev": "7-abc"}
    doc["job"][0]["exec_time"] = 2  # an integer where a float is usual
    doc["job"][1]["start_time"] = "yesterday"
    row = source.job_row(doc)
    assert row[7] == 7
    assert row[8][0][6] == 2.0 and isinstance(row[8][0][6], float)
    assert row[8][1][7] is None



def test_job_row_reads_a_field_left_out_as_its_default() -> None:
    doc = {"_id": "j", "_rev": "1-a", "type": "job", "creator": "global",
           "job": [{"do": "make"}]}
    row = source.job_row(doc)
    assert row[1:5] == ("global", 0, None, 0)  # creator, priority, status, current step
    assert row[5] is None and row[9] == []  # not yet accepted; no history
    assert row[8][0][:3] == ("any", False, 0)  # target, targeted, epoch
    assert row[8][0][11:13] == (None, None)  # no progress reported
    assert row[8][0][13:] == (False, [])  # no broadcast, no sub-runs


# -- the command -----------------------------------------------------------------------


def sites_dir(directory: Path, url: str, database: str,
              login: tuple[str, str] | None = None) -> Path:
    """A sites directory whose one site, global, is `database` at `url`, logging in
    with `login` from a credentials file when given."""
    lines = ['name = "global"', "[couch]", f'url = "{url}"', f'database = "{database}"']
    if login is not None:
        write_credentials(directory / "secrets" / "global.toml", *login)
        lines.append('credentials = "secrets/global.toml"')
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "global.toml").write_text("\n".join(lines) + "\n")
    return directory


def run_command(sites: Path, out: Path, *options: str) -> Result:
    """`jobdist report` as a person runs it, the environment's logins left out."""
    runner = CliRunner(env={name: None for name in (
        "JOBDIST_SITE", "JOBDIST_COUCH_USER", "JOBDIST_COUCH_PASSWORD")})
    return runner.invoke(main, ["report", "--sites", str(sites), "--out", str(out), *options])


def test_command_runs_and_prints_the_summary(couch_server: LocalServer, jobs_db: str,
                                              spark: Any, tmp_path: Path) -> None:
    sites = sites_dir(tmp_path / "sites", couch_server.url, jobs_db)
    answer = run_command(sites, tmp_path / "out", "--master", "local[2]")
    assert answer.exit_code == 0, answer.output
    assert "report: " in answer.output and "0.400 s / 0.560 s" in answer.output
    assert (tmp_path / "out" / "report.html").exists()


@pytest.fixture(scope="module")
def locked_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    """A server with authentication on, as `jobdist cluster up` runs them: job-d in `jobs`,
    which only logged-in members may read."""
    with LocalServer(free_port(), tmp_path_factory.mktemp("locked"), in_memory=True,
                     admin=ADMIN) as server:
        database = Couch(server.url, user=ADMIN[0], password=ADMIN[1]).ensure_database("jobs")
        database.bulk_docs([job_d()])
        add_views(database)
        database.put_security({"admins": {"names": [], "roles": []},
                               "members": {"names": [], "roles": ["site"]}})
        assert requests.get(database.url, timeout=10).status_code == 401
        yield server


def test_command_logs_in_as_the_sites_config_says(locked_server: LocalServer, spark: Any,
                                                  tmp_path: Path) -> None:
    sites = sites_dir(tmp_path / "sites", locked_server.url, "jobs", login=ADMIN)
    answer = run_command(sites, tmp_path / "out", "--site", "global", "--master", "local[2]")
    assert answer.exit_code == 0, answer.output
    assert set(rows_by(spark, tmp_path / "out", "jobs", "job_id")) == {"job-d"}


def test_every_job_is_read_whatever_its_id_and_a_malformed_one_is_skipped(
        spark: Any, couch_server: LocalServer, tmp_path: Path) -> None:
    name = f"t_any_id_{uuid.uuid4().hex[:8]}"
    database = Couch(couch_server.url).ensure_database(name)
    try:
        # As the README's curl does: CouchDB picks a random id.
        posted = requests.post(database.url, timeout=10, json={
            "type": "job", "creator": "global",
            "job": [{"target": "any", "do": "hostname"}]}).json()["id"]
        database.bulk_docs([
            job_d(),
            {"_id": "job-bad", "type": "job", "creator": "global", "job": []},
            {"_id": "site-global", "type": "site", "site": "global"},
            {"_id": "schedule-nightly", "type": "schedule", "name": "nightly"},
        ])
        add_views(database)
        answer = run_command(sites_dir(tmp_path / "sites", couch_server.url, name), tmp_path,
                             "--master", "local[2]")
    finally:
        requests.delete(database.url, timeout=10)
    assert answer.exit_code == 0, answer.output
    jobs = rows_by(spark, tmp_path, "jobs", "job_id")
    assert set(jobs) == {"job-d", posted} and jobs[posted]["status"] == "live"
    assert answer.stderr.splitlines() == [
        "jobdist: skipped 1 job documents that break the job rules "
        "(job-bad: job: must be a non-empty list of steps); see report.html"]
    html_page = (tmp_path / "report.html").read_text()
    assert "Skipped jobs" in html_page and "job-bad" in html_page and "2 jobs" in html_page


@pytest.mark.parametrize(("problem", "says"), [
    ("unreachable", "cannot reach the CouchDB of site global"),
    ("wrong password", "check the site's credentials"),
    ("missing database", "no_db_file (run `jobdist setup`"),
    ("no design documents", "run `jobdist setup`"),
])
def test_command_errors_are_one_line(problem: str, says: str, couch_server: LocalServer,
                                     locked_server: LocalServer, tmp_path: Path) -> None:
    password = "s3cret-pw"
    url, db, login = couch_server.url, f"t_missing_{uuid.uuid4().hex[:8]}", None
    if problem == "unreachable":
        url, login = f"http://127.0.0.1:{free_port()}", (ADMIN[0], password)
    elif problem == "wrong password":
        url, db, login = locked_server.url, "jobs", (ADMIN[0], password)
    elif problem == "no design documents":
        Couch(url).ensure_database(db)
    try:
        answer = run_command(sites_dir(tmp_path, url, db, login), tmp_path / "out")
    finally:
        requests.delete(f"{couch_server.url}/{db}", timeout=10)
    assert answer.exit_code == 2
    lines = answer.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobdist: "), answer.output
    assert says in lines[0], lines[0]
    assert password not in answer.output and "Traceback" not in answer.output


def test_command_without_java(couch_server: LocalServer, jobs_db: str, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql import SparkSession

    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))
    answer = run_command(sites_dir(tmp_path / "sites", couch_server.url, jobs_db), tmp_path)
    assert answer.exit_code == 2 and "Traceback" not in answer.output
    assert answer.stderr.strip() == (
        "jobdist: Java not found: Spark needs Java 17 or 21 (install a JDK or set JAVA_HOME)")


# The command as run where the `analytics` extra is not installed: pyspark, and the py4j
# that comes with it, cannot be imported.
WITHOUT_PYSPARK = """
import sys

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"pyspark", "py4j"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NotInstalled())
from jobdist.cli import main
main()
"""


def test_command_without_pyspark(couch_server: LocalServer, jobs_db: str,
                                 tmp_path: Path) -> None:
    sites = sites_dir(tmp_path / "sites", couch_server.url, jobs_db)
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PYSPARK, "report", "--sites", str(sites),
         "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (
        2, "jobdist: pyspark is not installed: pip install 'jobdist[analytics]'\n")


# -- broadcast fan-out ---------------------------------------------------------------------


def broadcast_job(name: str, finishes: dict[str, float | None], dropped: list[str]) -> Doc:
    """A job whose step 0 ran at each site of `finishes` (None: never ended), opened at 1 s."""
    doc = new_job("global", [new_step("snapshot", target="all"), new_step("verify")],
                  created_at=at(0.0), job_id=f"job-{name}")
    snapshot = doc["job"][0]
    snapshot.update(step_status="finished", start_time=at(1.0), finish_time=at(9.0),
                    runs={}, dropped=dropped)
    for site, finish in finishes.items():
        snapshot["runs"][site] = {
            "epoch": 1, "status": "finished" if finish else "running",
            "executioner": f"{site}/w1", "start_time": at(1.5),
            "finish_time": at(finish) if finish else None,
            "exec_time": finish - 1.5 if finish else None, "lease_until": None,
            "attempts": 1, "exit_code": 0 if finish else None, "output": None,
            "progress": None}
    doc["step"] = 1
    return doc


def test_broadcast_fan_out_and_the_slowest_sites_lag(spark: Any, couch_server: LocalServer,
                                                     tmp_path: Path) -> None:
    name = f"t_broadcast_{uuid.uuid4().hex[:8]}"
    database = Couch(couch_server.url).ensure_database(name)
    try:
        database.bulk_docs([
            broadcast_job("x", {"global": 2.0, "reg_a": 3.0, "reg_b": 5.5}, []),
            broadcast_job("y", {"global": 2.5, "reg_a": 4.0, "reg_c": None}, ["reg_c"]),
            job_d(),  # no broadcast: no row
        ])
        add_views(database)
        summary = page.run_report(CouchSource(couch_server.url, name), tmp_path, "local[2]")
        rows = rows_by(spark, tmp_path, "broadcasts", "job_id")
        sites = rows_by(spark, tmp_path, "sites", "site")
        jobs = rows_by(spark, tmp_path, "jobs", "job_id")
    finally:
        requests.delete(f"{couch_server.url}/{name}", timeout=10)
    assert set(rows) == {"job-x", "job-y"}
    x, y = rows["job-x"], rows["job-y"]
    assert (x["sites"], x["finished"], x["dropped"], x["slowest_site"]) == (3, 3, 0, "reg_b")
    assert x["lag_s"] == pytest.approx(3.5) and x["span_s"] == pytest.approx(4.5)
    assert (y["sites"], y["finished"], y["dropped"], y["slowest_site"]) == (2, 2, 1, "reg_a")
    assert y["lag_s"] == pytest.approx(1.5)
    broadcast = summary["broadcast"]
    assert broadcast["steps"] == 2 and broadcast["sites_per_step"]["mean"] == 2.5
    assert broadcast["lag_s"]["max"] == pytest.approx(3.5)
    assert broadcast["slowest_sites"] == {"reg_a": 1, "reg_b": 1}
    html_page = (tmp_path / "report.html").read_text()
    assert "broadcast steps (sites each, mean)" in html_page and "2 (2.50)" in html_page
    # Each site's part counts as a step it ran (reg_b also ran job-d's two steps; the
    # dropped reg_c's part counts nowhere), runnable from the step's opening at 1 s.
    assert {site: (row["steps"], row["busy_s"]) for site, row in sites.items()} == {
        "global": (2, 1.5), "reg_a": (2, 4.0), "reg_b": (3, 5.5)}
    assert sites["global"]["overhead_p50_s"] == pytest.approx(0.5)
    # The sites run a broadcast step in parallel: its part of the ideal is the longest
    # sub-run (reg_b's 1.5 -> 5.5 in job-x; reg_a's 1.5 -> 4.0 in job-y, reg_c dropped).
    assert jobs["job-x"]["ideal_s"] == pytest.approx(4.0)
    assert jobs["job-y"]["ideal_s"] == pytest.approx(2.5)


# -- waiting jobs (docs/analytics.md, "waits") -----------------------------------------


def waits_jobs() -> list[Doc]:
    """w-a runs; w-b waits for it and is released; w-c is failed by the job it waited
    for; w-d is delayed to 5.0; w-e waits for a job that never comes; w-f waits for
    nothing."""
    first = job("w-a", 0.0, ["any"], "success")
    ran(first["job"][0], "reg_a", 0.5, 1.5)
    released = job("w-b", 0.2, ["any"], "success")
    released["after"] = ["job-w-a"]
    log(released, "ready", 0, "global", 1.6, "released from wait: job-w-a success")
    log(released, "started", 0, "reg_b", 1.7)
    ran(released["job"][0], "reg_b", 1.7, 2.7)
    failed = job("w-c", 0.3, ["any"], "failed")
    failed["after"] = ["job-w-x", "job-w-a"]
    log(failed, "failed", 0, "global", 2.0, "job-w-x, which it waited for, failed",
        Reason.WAITED_FOR)
    delayed = job("w-d", 1.0, ["any"], "success")
    delayed["not_before"] = at(5.0)
    log(delayed, "ready", 0, "global", 5.1, f"released from wait: not before {at(5.0)}")
    log(delayed, "started", 0, "global", 5.2)
    ran(delayed["job"][0], "global", 5.2, 6.0)
    never = job("w-e", 2.0, ["any"], None)
    never["after"] = ["job-never"]
    return [first, released, failed, delayed, never, job("w-f", 3.0, ["any"], "success"),
            *ticked_jobs()]


def ticked_jobs() -> list[Doc]:
    """Jobs schedules made ("ticks"): t-1 created 0.5 s after its tick, started 1.0 s
    after it; t-2 created 2.0 s late (a catch-up), not started yet; t-3 another schedule's."""
    on_time = job("t-1", 4.5, ["any"], "success")
    on_time["schedule"] = {"name": "nightly", "tick": at(4.0)}
    log(on_time, "started", 0, "reg_a", 5.0)
    ran(on_time["job"][0], "reg_a", 5.0, 5.5)
    late = job("t-2", 12.0, ["any"], None)
    late["schedule"] = {"name": "nightly", "tick": at(10.0)}
    other = job("t-3", 6.25, ["any"], "success")
    other["schedule"] = {"name": "hourly", "tick": at(6.0)}
    log(other, "started", 0, "global", 6.5)
    ran(other["job"][0], "global", 6.5, 7.0)
    return [on_time, late, other]


@pytest.fixture(scope="module")
def waits_result(spark: Any, couch_server: LocalServer,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict, Path]]:
    name = f"t_waits_{uuid.uuid4().hex[:8]}"
    database = Couch(couch_server.url).ensure_database(name)
    assert all(isinstance(r, Saved) for r in database.bulk_docs(waits_jobs()))
    add_views(database)
    out = tmp_path_factory.mktemp("waits")
    try:
        yield page.run_report(CouchSource(couch_server.url, name), out, "local[2]",
                              WORKERS), out
    finally:
        requests.delete(f"{couch_server.url}/{name}", timeout=10)


def test_waits_table_times_each_wait_and_the_lateness_of_delayed_starts(
        spark: Any, waits_result: tuple[dict, Path]) -> None:
    waits = rows_by(spark, waits_result[1], "waits", "job_id")
    assert set(waits) == {"job-w-b", "job-w-c", "job-w-d", "job-w-e"}  # they wait, or waited
    figures = {job_id: (row["status"], row["after_count"], row["failed_by_dependency"],
                        row["wait_s"], row["start_lateness_s"]) for job_id, row in waits.items()}
    assert figures == {
        "job-w-b": ("success", 1, False, pytest.approx(1.6 - 0.2), None),
        "job-w-c": ("failed", 2, True, pytest.approx(2.0 - 0.3), None),
        "job-w-d": ("success", 0, False, pytest.approx(5.1 - 1.0), pytest.approx(5.2 - 5.0)),
        "job-w-e": ("live", 1, False, None, None),
    }


def test_overhead_leaves_out_the_time_a_job_was_meant_to_wait(
        spark: Any, waits_result: tuple[dict, Path]) -> None:
    steps = rows_by(spark, waits_result[1], "steps", "job_id", "step")
    overheads = {job_id: steps[(job_id, 0)]["overhead_s"]
                 for job_id in ("job-w-a", "job-w-b", "job-w-d")}
    assert overheads == {
        "job-w-a": pytest.approx(0.5 - 0.0),  # waits for nothing: from its creation
        "job-w-b": pytest.approx(1.7 - 1.6),  # from its release after job-w-a
        "job-w-d": pytest.approx(5.2 - 5.1),  # not before 5.0, released at 5.1
    }


def test_waits_summary_and_report(waits_result: tuple[dict, Path]) -> None:
    summary, out = waits_result
    waits = summary["waits"]
    assert (waits["jobs"], waits["released"], waits["failed_by_dependency"],
            waits["not_released"], waits["delayed"]) == (4, 2, 1, 1, 1)
    assert waits["wait_s"]["p50"] == pytest.approx(1.7)  # 1.4 1.7 4.1
    assert waits["wait_s"]["max"] == pytest.approx(4.1)
    assert waits["start_lateness_s"]["max"] == pytest.approx(0.2)
    html_page = (out / "report.html").read_text()
    for text in ("4: 2 / 1 / 1", "1.700 s / 4.100 s", "1: 0.200 s / 0.200 s"):
        assert text in html_page, text


def test_ticks_table_says_how_late_each_scheduled_job_was_made_and_started(
        spark: Any, waits_result: tuple[dict, Path]) -> None:
    summary, out = waits_result
    ticks = rows_by(spark, out, "ticks", "job_id")
    assert {job_id: (row["schedule"], row["status"], row["creation_lateness_s"],
                     row["start_lateness_s"]) for job_id, row in ticks.items()} == {
        "job-t-1": ("nightly", "success", pytest.approx(0.5), pytest.approx(1.0)),
        "job-t-2": ("nightly", "live", pytest.approx(2.0), None),
        "job-t-3": ("hourly", "success", pytest.approx(0.25), pytest.approx(0.5)),
    }
    figures = summary["ticks"]
    assert (figures["ticks"], figures["by_schedule"]) == (3, {"nightly": 2, "hourly": 1})
    assert figures["creation_lateness_s"]["p50"] == pytest.approx(0.5)  # 0.25 0.5 2.0
    assert figures["start_lateness_s"]["max"] == pytest.approx(1.0)
    html_page = (out / "report.html").read_text()
    for text in ("3 (2)", "0.500 s / 2.000 s", "0.750 s / 1.000 s"):
        assert text in html_page, text
