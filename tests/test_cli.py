"""The `jobdist` command on a real local 3-site cluster (servers, replication, daemons).

One cluster for the module; every command runs in process (CliRunner) with
$JOBDIST_SITES pointing at its sites directory.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from jobdist.cli import main
from jobdist.core import merge
from jobdist.couch import Couch, Database
from jobdist.couch_sync import put_replication
from jobdist.lab.cluster import LocalCluster, process_start_time
from jobdist.lab.localserver import LocalServer, free_port
from jobdist.lab.scenarios import site_db, write_sites
from jobdist.model import JOB_FORMAT, Doc, new_job, new_step

from .helpers import conflicting_leaves, wait_for, write_conflict

pytestmark = pytest.mark.e2e

SITES = ("global", "reg_a", "reg_b")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("cli-cluster")
    with LocalCluster(write_sites(root / "sites", 3, keepalive=2.0), root / "state",
                      in_memory=True) as local:
        yield local


Jobdist = Callable[..., Result]


@pytest.fixture
def jobdist(cluster: LocalCluster) -> Jobdist:
    def run(*args: str, stdin: str | None = None) -> Result:
        runner = CliRunner(env={"JOBDIST_SITES": str(cluster.sites_dir), "JOBDIST_SITE": None})
        result = runner.invoke(main, list(args), input=stdin)
        assert "Traceback" not in result.output, result.output
        return result

    return run


def merged_at(cluster: LocalCluster, site: str, job_id: str) -> Doc | None:
    leaves = site_db(cluster, site).leaves(job_id)
    return merge(leaves) if leaves else None


# --- submit, show, logs ---------------------------------------------------------------


def test_submit_with_flags_waits_then_show_and_logs(jobdist: Jobdist,
                                                    cluster: LocalCluster) -> None:
    result = jobdist("submit", "--step", "echo hello-from-$JOBDIST_SITE",
                     "--step", "echo to-stderr >&2", "--target", "any", "--target", "reg_b",
                     "--retries", "1", "--timeout", "60", "--priority", "3", "--wait")
    assert result.exit_code == 0, result.output
    job_id = result.stdout.splitlines()[0]
    assert job_id.startswith("job-")
    assert result.stdout.rstrip().endswith(f"{job_id}: success")
    assert " started " in result.stdout  # the progress lines

    doc = merged_at(cluster, "global", job_id)
    assert doc is not None and doc["priority"] == 3
    assert [s["target"] for s in doc["job"]] == ["any", "reg_b"]
    assert all(s["retry_strategy"]["max_retries"] == 1 and s["timeout"] == 60
               for s in doc["job"])
    assert doc["job"][1]["executioner"].startswith("reg_b/")

    # Claims that lost to the creator's start are conflicting leaves until the creator
    # cleans them up, which may come a moment after the job ended elsewhere.
    shown = wait_for(lambda: (out := jobdist("show", job_id)).exit_code == 0
                     and "conflicting" not in out.stdout and out, timeout=15,
                     what="the creator to clean up the losing claims")
    assert job_id in shown.stdout and "status   success" in shown.stdout
    lines = shown.stdout.splitlines()
    step_1 = next(line for line in lines if line.startswith("1 "))
    assert "finished" in step_1 and "reg_b/w" in step_1 and "echo to-stderr >&2" in step_1
    assert any(" created " in line for line in lines)  # the history table

    as_json = json.loads(jobdist("show", job_id, "--json", "--site", "reg_a").stdout)
    assert as_json["_id"] == job_id and as_json["job_status"] == "success"

    logs = jobdist("logs", job_id)
    assert logs.exit_code == 0
    assert "hello-from-" in logs.stdout and "to-stderr" in logs.stdout
    assert jobdist("logs", job_id, "--step", "1").stdout.count("== step") == 1


def test_submit_wait_exits_1_when_the_job_fails(jobdist: Jobdist) -> None:
    result = jobdist("submit", "--step", "echo boom >&2; exit 4", "--wait")
    assert result.exit_code == 1, result.output
    assert ": failed (step 0: exit 4" in result.stdout


def test_submit_a_yaml_file(jobdist: Jobdist, cluster: LocalCluster, tmp_path: Path) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text("priority: 2\njob:\n  - do: echo from yaml\n    target: [reg_a, reg_b]\n"
                        "    retry_strategy: {max_retries: 0}\n")
    result = jobdist("submit", str(job_file), "--site", "reg_a", "--wait")
    assert result.exit_code == 0, result.output
    doc = merged_at(cluster, "reg_a", result.stdout.splitlines()[0])
    assert doc is not None
    assert doc["creator"] == "reg_a" and doc["priority"] == 2
    assert doc["job"][0]["target"] == ["reg_a", "reg_b"]


def test_show_merges_every_conflicting_revision(jobdist: Jobdist,
                                                cluster: LocalCluster) -> None:
    open_leaf, done_leaf = conflicting_leaves()
    db = site_db(cluster, "global")
    write_conflict(db, [open_leaf, done_leaf])
    job_id = open_leaf["_id"]
    assert db.get(job_id)["job_status"] is None  # CouchDB's winner is the open leaf

    shown = jobdist("show", job_id)
    assert shown.exit_code == 0, shown.output
    assert "(1 conflicting revision, merged)" in shown.stdout
    assert "status   success" in shown.stdout
    assert any(" finished " in line and "nowhere" in line for line in shown.stdout.splitlines())
    doc = json.loads(jobdist("show", job_id, "--json").stdout)
    assert doc["job_status"] == "success" and doc["_rev"] == open_leaf["_rev"]
    assert doc["_conflicts"] == [done_leaf["_rev"]]
    assert [h["event"] for h in doc["history"]] == ["created", "finished"]


def test_show_an_unknown_job(jobdist: Jobdist) -> None:
    result = jobdist("show", "job-nope")
    assert result.exit_code == 2
    assert result.stderr == "jobdist: no job 'job-nope' at site global\n"


def test_show_and_cancel_refuse_a_job_of_a_newer_format(jobdist: Jobdist,
                                                        cluster: LocalCluster) -> None:
    newer = {**conflicting_leaves()[0], "_id": "job-next", "format": JOB_FORMAT + 1}
    write_conflict(site_db(cluster, "global"), [newer])
    for command in ("show", "cancel"):
        result = jobdist(command, "job-next")
        assert result.exit_code != 0
        assert result.stderr == (f"jobdist: job 'job-next' is of format {JOB_FORMAT + 1}, newer "
                                 f"than this jobdist reads ({JOB_FORMAT}): use the jobdist of "
                                 "an upgraded site\n")


# --- list ---------------------------------------------------------------------------------


def listing_jobs() -> list[Doc]:
    """30 jobs nobody can run (their sites do not exist), created in 2030: the newest.

    The daemons end the live ones (no known site may arbitrate or run them), so
    a test lists them once that has settled.
    """
    jobs = []
    for i in range(30):
        created = f"2030-01-01T00:00:{i:02d}.000000Z"
        target: str | list[str] = "lst-a" if i % 2 == 0 else ["lst-a", "lst-b"]
        job = new_job("lister" if i % 3 else "lister2", [new_step(f"echo {i}", target=target)],
                      created_at=created)
        status = ("live", "success", "failed", "cancelled")[i % 4]
        if status != "live":
            job["job_status"] = status
        if status == "success":
            job["step"] = 1
            job["job"][0]["step_status"] = "finished"
        if status == "failed":
            job["job"][0]["step_status"] = "failed"
        jobs.append(job)
    return jobs


LISTING_SITES = ("lister", "lister2", "lst-a", "lst-b", "lst-nothing")


def listed(jobdist: Jobdist, *args: str) -> list[Doc]:
    result = jobdist("list", "--json", *args)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def listing_sites(cluster: LocalCluster, directory: Path) -> Path:
    """The cluster's sites and the listing jobs' sites, for the CLI only: `list` refuses
    sites it does not know, and the daemons must not know these."""
    shutil.copytree(cluster.sites_dir, directory)
    for name in LISTING_SITES:
        (directory / f"{name}.toml").write_text(
            f'name = "{name}"\n[couch]\nurl = "http://127.0.0.1:{free_port()}"\n')
    return directory


def test_list_filters_and_pages_newest_first(cluster: LocalCluster, tmp_path: Path) -> None:
    sites = listing_sites(cluster, tmp_path / "sites")

    def jobdist(*args: str) -> Result:
        runner = CliRunner(env={"JOBDIST_SITES": str(sites), "JOBDIST_SITE": None})
        result = runner.invoke(main, list(args))
        assert "Traceback" not in result.output, result.output
        return result

    db = site_db(cluster, "global")
    written = listing_jobs()
    db.bulk_docs(written)
    ids_written = [job["_id"] for job in written]
    wait_for(lambda: all(job["job_status"] for job in db.bulk_get(ids_written)),
             what="the daemons end the jobs nobody can run")
    jobs = db.bulk_get(ids_written)
    newest_first = sorted(jobs, key=lambda job: job["created_at"], reverse=True)

    def ids(selected: list[Doc]) -> list[str]:
        return [job["_id"] for job in selected]

    def status(job: Doc) -> str:
        return job["job_status"] or "live"

    # Pages of 7 through the 20 jobs of one creator, each page from where the last ended.
    pages, before = [], None
    while True:
        args = ["--creator", "lister", "--limit", "7"] + (["--before", before] if before else [])
        page = listed(jobdist, *args)
        if not page:
            break
        assert len(page) <= 7
        pages.append(page)
        before = page[-1]["created_at"]
    assert [len(page) for page in pages] == [7, 7, 6]
    assert [row["id"] for page in pages for row in page] == ids(
        [job for job in newest_first if job["creator"] == "lister"])

    assert [r["id"] for r in listed(jobdist, "--limit", "3")] == ids(newest_first[:3])
    assert [r["id"] for r in listed(jobdist, "--creator", "lister", "--status", "failed")] == ids(
        [job for job in newest_first if job["creator"] == "lister" and status(job) == "failed"])
    assert [r["id"] for r in listed(jobdist, "--site", "lst-b", "--limit", "100")] == ids(
        [job for job in newest_first if isinstance(job["job"][0]["target"], list)])
    rows = listed(jobdist, "--site", "lst-b", "--creator", "lister2", "--status", "cancelled")
    assert [r["id"] for r in rows] == ids(
        [job for job in newest_first if isinstance(job["job"][0]["target"], list)
         and job["creator"] == "lister2" and status(job) == "cancelled"])
    assert len(rows) == 3
    assert all(r["status"] == "cancelled" and r["creator"] == "lister2" for r in rows)
    assert listed(jobdist, "--site", "lst-nothing") == []

    table = jobdist("list", "--creator", "lister", "--limit", "5")
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["JOB", "STATUS", "STEP"]
    assert [line.split()[0] for line in lines[1:6]] == ids(
        [job for job in newest_first if job["creator"] == "lister"][:5])
    assert lines[6].startswith("5 newest shown; older: jobdist list --creator lister --before ")


# --- cancel, watch ------------------------------------------------------------------------


def test_cancel_kills_the_running_step_everywhere(jobdist: Jobdist, cluster: LocalCluster,
                                                  tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    result = jobdist("submit", "--step", f"echo $$ > {pid_file}; exec sleep 30",
                     "--step", "echo never", "--target", "reg_a", "--target", "any")
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    pid = wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="start")
    pid = int(pid)
    assert b"sleep" in Path(f"/proc/{pid}/cmdline").read_bytes()

    # Shown running once its start is written: within [daemon] start_write_delay.
    watched = wait_for(lambda: (w := jobdist("watch", "--once")).exit_code == 0
                       and job_id in w.stdout and w, what="the step shown running")
    running = next(line for line in watched.stdout.splitlines() if job_id in line).split()
    assert running[0] == "reg_a" and running[1].startswith("reg_a/w")
    for site in SITES:
        assert any(line.startswith(site) for line in watched.stdout.splitlines())

    started = time.monotonic()
    cancelled = jobdist("cancel", job_id, "--reason", "operator test")
    assert cancelled.exit_code == 0, cancelled.output
    assert cancelled.stdout.startswith(f"cancelled {job_id} at site global; step 0")
    assert "running at reg_a/w" in cancelled.stdout

    for site in SITES:
        wait_for(lambda site=site: (merged_at(cluster, site, job_id) or {}).get("job_status")
                 == "cancelled", timeout=10, what=f"cancelled at {site}")
    wait_for(lambda: process_start_time(pid) == "", timeout=10, what="the step's process ends")
    assert time.monotonic() - started < 10
    doc = wait_for(lambda: next((d for d in [merged_at(cluster, "global", job_id)]
                                 if any(h["event"] == "cancelled" and h["site"] == "reg_a"
                                        for h in d["history"])), None),
                   timeout=10, what="reg_a reports the kill")
    assert doc["job"][1]["step_status"] is None  # the next step never ran
    killed = doc["job"][0]  # the document says how the run ended, not "running"
    assert (killed["step_status"], killed["lease_until"]) == ("failed", None)
    assert killed["finish_time"] is not None
    shown = jobdist("show", job_id)
    assert " cancelled " in next(line for line in shown.stdout.splitlines()
                                 if line.lstrip().startswith("0 "))
    assert any(h["event"] == "cancelled" and h["detail"] == "operator test"
               for h in doc["history"])

    again = jobdist("cancel", job_id)
    assert (again.exit_code, again.stdout) == (0, f"{job_id} was cancelled already\n")


def test_cancel_reads_again_after_a_conflict(jobdist: Jobdist, cluster: LocalCluster,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    job = new_job("global", [new_step("sleep 60", target="reg_a")])
    db = site_db(cluster, "global")
    db.save(job)
    # Once it runs, nothing else writes to it for a while (the lease lasts 60 s).
    wait_for(lambda: (merged_at(cluster, "global", job["_id"]) or {}).get("job", [{}])[0].get(
        "step_status") == "running", what="reg_a starts the step")
    real_save = Database.save
    written: list[Doc] = []

    def racing_save(self: Database, doc: Doc) -> Any:
        written.append(doc)
        if len(written) == 1:  # someone else writes between our read and our write
            real_save(self, {**self.get(doc["_id"]), "priority": 7})
        return real_save(self, doc)

    monkeypatch.setattr(Database, "save", racing_save)
    result = jobdist("cancel", job["_id"])
    assert result.exit_code == 0
    assert result.stdout.startswith(f"cancelled {job['_id']} at site global; step 0 (sleep 60) "
                                    "is running at reg_a/w")
    assert len(written) == 2 and written[1]["priority"] == 7  # decided again on the new state
    doc = merged_at(cluster, "global", job["_id"])
    assert doc is not None and (doc["job_status"], doc["priority"]) == ("cancelled", 7)


def test_cancel_a_finished_job_exits_1(jobdist: Jobdist) -> None:
    job_id = jobdist("submit", "--step", "true", "--wait").stdout.splitlines()[0]
    result = jobdist("cancel", job_id)
    assert result.exit_code == 1
    assert result.stdout == f"{job_id} already ended: success; nothing to cancel\n"


def test_watch_once_counts_jobs_per_site(jobdist: Jobdist) -> None:
    result = jobdist("watch", "--once")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("SITE "))
    assert header.split() == ["SITE", "COUCHDB", "WORKERS", "BUSY", "LIVE", "WAITING",
                              "SUCCESS", "FAILED", "CANCELLED"]
    row = next(line for line in lines if line.startswith("global "))
    assert row.split()[2] in ("0/2", "1/2", "2/2")
    assert int(row.split()[5]) >= 1  # successes so far


# --- setup --------------------------------------------------------------------------------


def test_setup_on_the_running_cluster_changes_nothing(jobdist: Jobdist) -> None:
    result = jobdist("setup")
    assert (result.exit_code, result.stdout) == (0, "setup: nothing to change\n"), result.output


def test_setup_creates_everything_then_changes_nothing(tmp_path: Path) -> None:
    server = LocalServer(free_port(), tmp_path / "couch", in_memory=True)
    try:
        server.start()
        sites = tmp_path / "sites"
        sites.mkdir()
        for name, peer in (("s1", "s2"), ("s2", "s1")):
            (sites / f"{name}.toml").write_text(
                f'name = "{name}"\npeers = ["{peer}"]\n[couch]\nurl = "{server.url}"\n'
                f'database = "jobs_{name}"\n')
        runner = CliRunner(env={"JOBDIST_SITES": str(sites)})

        first = runner.invoke(main, ["setup"])
        assert first.exit_code == 0, first.output
        for name in ("s1", "s2"):
            assert f"{name}: created database jobs_{name}" in first.stdout
            assert f"{name}: wrote _design/jobdist" in first.stdout
        # Not the `jobs` database: the ids name it (topology.owned_prefix).
        assert "s1: wrote replication jobdist:jobs_s1:s1-to-s2" in first.stdout
        couch = Couch(server.url)
        replicator = couch.replicator()
        doc = replicator.get("jobdist:jobs_s1:s1-to-s2")
        assert doc["filter"] == "jobdist/jobs" and "selector" not in doc
        # pouchdb-server reads its own database in process (topology.replication_doc).
        assert doc["source"] == "jobs_s1" and doc["target"].endswith("/jobs_s2")
        design_rev = couch.database("jobs_s1").get("_design/jobdist")["_rev"]

        second = runner.invoke(main, ["setup"])
        assert (second.exit_code, second.stdout) == (0, "setup: nothing to change\n")
        assert couch.database("jobs_s1").get("_design/jobdist")["_rev"] == design_rev

        # Stale replications of the databases set up: a finished one goes; a running one
        # stays on pouchdb-server (deleting it would crash the server), with a warning.
        s1, s2 = f"{server.url}/jobs_s1", f"{server.url}/jobs_s2"
        one_shot = {"source": s1, "target": s2, "continuous": False}
        put_replication(replicator, "jobdist:jobs_s1:s1-to-old", one_shot)
        put_replication(replicator, "jobdist:jobs_s2:s2-to-gone",
                        {"source": s2, "target": s1, "continuous": True})
        put_replication(replicator, "theirs-s1-to-s2", one_shot)
        couch.ensure_database("jobs")
        put_replication(replicator, "jobdist-s1-to-old",  # database `jobs`'s
                        one_shot | {"source": f"{server.url}/jobs"})
        for doc_id in ("jobdist:jobs_s1:s1-to-old", "jobdist-s1-to-old"):
            wait_for(lambda: replicator.get(doc_id).get("_replication_state")  # noqa: B023
                     == "completed", what="the one-shot replication completes")
        third = runner.invoke(main, ["setup"])
        assert third.exit_code == 0, third.output
        assert third.stdout == (
            "s1: removed stale replication jobdist:jobs_s1:s1-to-old\nsetup: 1 changes\n")
        assert "stale replication jobdist:jobs_s2:s2-to-gone left in place" in third.stderr
        assert replicator.get("jobdist:jobs_s1:s1-to-old") is None
        assert replicator.get("theirs-s1-to-s2") is not None  # not ours: never touched
        assert replicator.get("jobdist-s1-to-old") is not None  # not these databases
        assert server.is_alive()
        fourth = runner.invoke(main, ["setup"])
        assert fourth.stdout == "setup: nothing to change\n"

        # Told the servers are Apache CouchDB, setup would write selectors: pouchdb-server
        # would crash on them, so each is refused in one line and nothing changes.
        told = runner.invoke(main, ["setup", "--server-kind", "couchdb"])
        assert told.exit_code != 0
        assert told.stderr.splitlines()[0].startswith(
            "jobdist: s1: replication 'jobdist:jobs_s1:s1-to-s2' not written"), told.stderr
        assert "selector would crash pouchdb-server" in told.stderr
        assert server.is_alive()
        assert replicator.get("jobdist:jobs_s1:s1-to-s2")["filter"] == "jobdist/jobs"
        assert runner.invoke(main, ["setup", "--server-kind", "pouchdb"]).stdout == (
            "setup: nothing to change\n")
    finally:
        server.stop()


# --- cleanup across sites -------------------------------------------------------------------


def test_cleanup_deletions_replicate_to_every_site(jobdist: Jobdist, cluster: LocalCluster,
                                                   tmp_path: Path) -> None:
    old = []
    for day in (1, 2):
        job = new_job("global", [new_step("true", target="reg_a")],
                      created_at=f"2020-01-0{day}T00:00:00.000000Z")
        job.update(job_status="success", step=1)
        job["job"][0]["step_status"] = "finished"
        old.append(job)
    site_db(cluster, "global").bulk_docs(old)
    ids = [job["_id"] for job in old]
    for site in SITES:
        wait_for(lambda site=site: len(site_db(cluster, site).bulk_get(ids)) == 2,
                 what=f"old jobs reach {site}")

    export = tmp_path / "old.jsonl"
    result = jobdist("cleanup", "--older-than", "30d", "--export", str(export))
    assert result.exit_code == 0, result.output
    assert f"exported 2 jobs to {export}" in result.stdout
    assert "removed 2 of 2 finished jobs" in result.stdout
    assert sorted(json.loads(line)["_id"] for line in export.read_text().splitlines()) == ids
    for site in SITES:
        wait_for(lambda site=site: site_db(cluster, site).bulk_get(ids) == [],
                 timeout=10, what=f"deletions reach {site}")


# --- progress -----------------------------------------------------------------------------


def test_a_running_step_reports_progress_to_show_watch_and_wait(
        jobdist: Jobdist, cluster: LocalCluster) -> None:
    """A step prints `JOBDIST_PROGRESS 0.5 halfway` and sleeps: within a few seconds the
    document holds it in the step, at every site, and `show` and `watch` print 50%;
    `--wait`'s event lines and the finished step keep the last value."""
    result = jobdist("submit", "--step", "echo JOBDIST_PROGRESS 0.5 halfway; sleep 6; "
                     "echo 'JOBDIST_PROGRESS 1 done'", "--target", "reg_a")
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    started = time.monotonic()
    for site in SITES:
        doc = wait_for(lambda site=site: (d := merged_at(cluster, site, job_id))
                       and d["job"][0].get("progress") and d, timeout=5,
                       what=f"the progress at {site}")
        report = doc["job"][0]["progress"]
        assert (report["fraction"], report["message"]) == (0.5, "halfway")
        assert doc["job"][0]["step_status"] == "running"
    assert time.monotonic() - started < 5
    shown = jobdist("show", job_id)
    assert "progress step 0: 50% halfway" in shown.stdout
    assert " running 50% " in next(line for line in shown.stdout.splitlines()
                                   if line.lstrip().startswith("0 "))
    watched = jobdist("watch", "--once")
    assert "50% halfway" in next(line for line in watched.stdout.splitlines() if job_id in line)

    waited = jobdist("submit", "--step", "printf 'JOBDIST_PROGRESS 0.25 a quarter\\n'; sleep 4",
                     "--wait")
    assert waited.exit_code == 0, waited.output
    assert "step 0  progress  25% a quarter" in waited.stdout

    doc = wait_until_ended(cluster, job_id)
    assert doc["job_status"] == "success"
    assert (doc["job"][0]["progress"]["fraction"], doc["job"][0]["progress"]["message"]) \
        == (1, "done")  # printed just before the end: the finish carries it


def wait_until_ended(cluster: LocalCluster, job_id: str) -> Doc:
    return wait_for(lambda: (d := merged_at(cluster, "global", job_id))
                    and d["job_status"] is not None and d, timeout=30, what="the job ends")


# --- broadcast steps ------------------------------------------------------------------


def test_a_broadcast_shows_each_site_and_its_fan_out_then_drop_site(
        jobdist: Jobdist, cluster: LocalCluster, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    slow_at_b = (f'echo part-at-$JOBDIST_SITE; [ "$JOBDIST_SITE" != reg_b ] || '
                 f'{{ echo $$ > {pid_file}; exec sleep 60; }}')
    result = jobdist("submit", "--step", slow_at_b, "--target", "all")
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()

    def parts_done() -> bool:
        doc = merged_at(cluster, "global", job_id) or {"job": [{}]}
        runs = doc["job"][0].get("runs") or {}
        return pid_file.exists() and all(runs.get(site, {}).get("status") == "finished"
                                         for site in ("global", "reg_a"))

    wait_for(parts_done, timeout=30, what="global and reg_a done, reg_b running")

    def listed_row() -> str | None:
        # (--creator: not the 30 live jobs "created in 2030" an earlier test leaves.)
        listed = jobdist("list", "--status", "live", "--creator", "global")
        assert listed.exit_code == 0, listed.output
        return next((line for line in listed.stdout.splitlines() if job_id in line), None)

    # The views index the winning revision only: a run replicated in as a conflict
    # shows once the creator has merged it, a moment after `parts_done` saw it.
    row = wait_for(lambda: next((r for r in [listed_row()] if r and "(2/3 sites)" in r), None),
                   timeout=10, what="the list shows two of three sites done")
    assert "1/1 (2/3 sites)" in row
    shown = jobdist("show", job_id)
    lines = shown.stdout.splitlines()
    assert "2/3 sites" in next(line for line in lines if line.lstrip().startswith("0 "))
    assert "running" in next(line for line in lines if "at reg_b" in line)
    assert "finished" in next(line for line in lines if "at reg_a" in line)

    elsewhere = jobdist("drop-site", job_id, "reg_b", "--site", "reg_a")
    assert elsewhere.exit_code == 2
    assert "only the job's creator drops sites: run this at global" in elsewhere.stderr
    unknown = jobdist("drop-site", job_id, "reg_x")
    assert unknown.exit_code == 2 and "reg_x is not one of step 0's sites" in unknown.stderr

    pid = int(pid_file.read_text())
    dropped = jobdist("drop-site", job_id, "reg_b", "--reason", "operator test")
    assert dropped.exit_code == 0, dropped.output
    doc = wait_for(lambda: next((d for d in [merged_at(cluster, "global", job_id)]
                                 if d and d["job_status"] == "success"), None),
                   timeout=20, what="the job ends without reg_b")
    wait_for(lambda: process_start_time(pid) == "", timeout=20,
             what="reg_b's part is stopped: it no longer counts")
    assert doc["job"][0]["dropped"] == ["reg_b"]
    shown = jobdist("show", job_id)
    assert "dropped" in next(line for line in shown.stdout.splitlines() if "at reg_b" in line)
    again = jobdist("drop-site", job_id, "reg_b")
    assert again.exit_code == 2 and "the job already ended: success" in again.stderr
    logs = jobdist("logs", job_id).stdout
    for site in ("global", "reg_a"):  # each site's run: its status, exit, time and output
        header = next(line for line in logs.splitlines() if line.startswith(f"== step 0 at {site}"))
        assert header.startswith(f"== step 0 at {site} (finished, exit 0, took "), header
        assert f"-- stdout\npart-at-{site}\n" in logs
    assert "== step 0 at reg_b (dropped" in logs


# --- waiting: submit --after / --after-policy / --at / --in, list --status waiting, show --

def test_submit_after_waits_shows_why_and_runs_once_the_job_succeeded(
        jobdist: Jobdist, cluster: LocalCluster, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    first = jobdist("submit", "--step", f"while [ ! -e {gate} ]; do sleep 0.1; done",
                    "--target", "reg_a", "--site", "reg_a").stdout.strip()
    result = jobdist("submit", "--step", "true", "--after", first, "--after", "job-not-yet")
    assert result.exit_code == 0, result.output
    second = result.stdout.strip()
    # Accepted, with a warning (`first`, just made at reg_a, may not have replicated yet).
    assert "jobdist: warning: global has no job " in result.stderr
    assert "job-not-yet (yet): this job waits until it has, and for ever if the id is " \
           "wrong (then cancel this job)\n" in result.stderr
    shown = jobdist("show", second)
    assert "status   waiting" in shown.stdout
    assert f"after    {first} (" in shown.stdout
    assert "job-not-yet (no such job at global)   policy success" in shown.stdout
    assert "global has no job job-not-yet (yet): this job waits until it has" in shown.stdout
    listed_ids = [row["id"] for row in listed(jobdist, "--status", "waiting")]
    assert second in listed_ids
    assert second not in [row["id"] for row in listed(jobdist, "--status", "live")]
    gate.touch()
    wait_for(lambda: (d := merged_at(cluster, "global", first)) and d["job_status"],
             timeout=30, what="the first job ends")
    # It still waits for the job that does not exist: the creator cannot know it never will.
    time.sleep(1.0)
    assert jobdist("show", second).stdout.count("status   waiting") == 1
    assert jobdist("cancel", second).exit_code == 0


def test_submit_after_policy_always_and_in_delay(jobdist: Jobdist, cluster: LocalCluster) -> None:
    first = jobdist("submit", "--step", "exit 3").stdout.strip()
    result = jobdist("submit", "--step", "true", "--after", first, "--after-policy", "always",
                     "--in", "2s", "--wait")
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr  # `first` is a job of this site
    job_id = result.stdout.splitlines()[0]
    doc = merged_at(cluster, "global", job_id)
    assert doc is not None and doc["after_policy"] == "always"
    ready = next(h for h in doc["history"] if h["event"] == "ready")
    started = next(h for h in doc["history"] if h["event"] == "started")
    assert ready["detail"] == f"released from wait: {first} failed, not before " \
        f"{doc['not_before']}"
    assert started["at"] >= doc["not_before"] >= doc["created_at"]


def test_submit_at_takes_a_zone_and_writes_utc(jobdist: Jobdist) -> None:
    result = jobdist("submit", "--step", "true", "--at", "2099-11-23T03:00+01:00", "--dry-run")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["not_before"] == "2099-11-23T02:00:00.000000Z"


@pytest.mark.parametrize(("args", "message"), [
    (("--at", "2026-11-23T02:00"), "--at '2026-11-23T02:00': say which zone: end it in Z"),
    (("--at", "tomorrow"), "--at 'tomorrow': not an ISO 8601 time (e.g. 2026-11-23T02:00Z)"),
    (("--in", "10x"), "'10x' is not a duration"),
    (("--in", "1m", "--at", "2026-11-23T02:00Z"), "give --at TIME or --in DURATION, not both"),
    (("--after", "job-a", "--after", "job-a"), "after[1]: duplicate job id"),
    (("--after-policy", "never"), "Invalid value for '--after-policy'"),
])
def test_submit_refuses_bad_waits_in_one_line(jobdist: Jobdist, args: tuple[str, ...],
                                              message: str) -> None:
    result = jobdist("submit", "--step", "true", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
