"""End to end: real pouchdb-servers, real replication, real daemons, real shell steps.

Each step appends to a ledger; the checks are the product's promises: every
step ran exactly once, on a site its target allows, the steps of each job in
order, and every job ended as expected. Replication runs through proxies that
put the sites regions apart, as the design's are (40 or 120 ms one way, with
jitter, 1 MB/s).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobdist import client
from jobdist.cli import main
from jobdist.clock import later, parse_time, utc_now
from jobdist.couch import Database
from jobdist.lab.audit import audit_run, read_ledger
from jobdist.lab.cluster import LocalCluster
from jobdist.lab.scenarios import (
    THESIS_SCENARIOS,
    check_ledger,
    ledger_command,
    proxied_sites,
    regions_apart,
    run_scenario,
    site_db,
    wait_until_done,
    write_sites,
)
from jobdist.model import Doc, new_job, new_step
from jobdist.schedules import new_schedule, tick_job_id, ticks

from .helpers import wait_for

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("scenario", THESIS_SCENARIOS, ids=lambda s: s.name.split(",")[0])
def test_thesis_scenario(scenario, tmp_path: Path) -> None:
    result = run_scenario(scenario, step_seconds=0.3, work_dir=tmp_path, links=regions_apart)
    assert check_ledger(result) == []
    assert result.statuses == {"success": scenario.jobs}
    # Revisions per step: at most 4 for untargeted steps, 2 for targeted (the thesis's counts).
    assert max(result.revisions) <= 1 + 4 * len(scenario.targets)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("cluster")
    with proxied_sites(root / "sites", 3, regions_apart, keepalive=2.0) as (sites, _), \
            LocalCluster(sites, root / "state", in_memory=True) as local:
        yield local


def submit(cluster: LocalCluster, steps: list[Doc], site: str = "global") -> tuple[Database, str]:
    db = site_db(cluster, site)
    job = new_job(site, steps)
    db.save(job)
    return db, job["_id"]


def run_job(cluster: LocalCluster, steps: list[Doc], timeout: float = 60.0) -> Doc:
    db, job_id = submit(cluster, steps)
    return wait_until_done(db, [job_id], timeout)[0]


def test_retries_then_success(cluster: LocalCluster, tmp_path: Path) -> None:
    counter = tmp_path / "count"
    command = (f"n=$(cat {counter} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {counter}; "
               f'[ "$n" -ge 3 ] && [ "$JOBDIST_ATTEMPT" = 3 ]')
    doc = run_job(cluster, [new_step(command, max_retries=4, sleep=0.1, sleep_factor=2)])
    assert doc["job_status"] == "success"
    assert doc["job"][0]["attempts"] == 3
    assert [h["event"] for h in doc["history"]].count("retried") == 2


def test_retries_exhausted_then_alt_do_succeeds(cluster: LocalCluster, tmp_path: Path) -> None:
    marker = tmp_path / "alt"
    doc = run_job(cluster, [new_step("echo why >&2; exit 3", max_retries=2, sleep=0.05,
                                     alt_do=f"touch {marker}"), new_step("true")])
    assert doc["job_status"] == "success"  # an alt_do that succeeds lets the job go on
    assert marker.exists()
    assert doc["job"][0]["attempts"] == 4
    # `jobdist logs` shows why do failed, not only what alt_do printed.
    assert doc["job"][0]["output"] == {
        "stdout": "", "stderr": "--- do (exit 3) ---\nwhy\n--- alt_do (exit 0) ---\n"}
    assert "alt_do succeeded" in next(
        h["detail"] for h in doc["history"] if h["event"] == "finished")


def test_failing_step_fails_the_job_and_runs_nothing_after(cluster: LocalCluster,
                                                          tmp_path: Path) -> None:
    after = tmp_path / "after"
    doc = run_job(cluster, [new_step("echo boom >&2; exit 7"), new_step(f"touch {after}")])
    assert doc["job_status"] == "failed"
    step = doc["job"][0]
    assert (step["step_status"], step["exit_code"]) == ("failed", 7)
    assert "boom" in step["output"]["stderr"]
    assert doc["step"] == 0 and not after.exists()


def test_step_timeout_kills_the_command(cluster: LocalCluster) -> None:
    started = time.monotonic()
    doc = run_job(cluster, [new_step("sleep 30", timeout=1)])
    assert doc["job_status"] == "failed"
    assert "timed out" in doc["history"][-1]["detail"]
    assert time.monotonic() - started < 25


def test_targets_are_respected(cluster: LocalCluster, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    doc = run_job(cluster, [new_step(ledger_command(0.1, ledger), target=t)
                            for t in ("reg_b", ["reg_a", "reg_b"], "global", "reg_a")])
    assert doc["job_status"] == "success"
    sites = [row[3] for row in read_ledger(ledger) if row[0] == "start"]
    assert sites[0] == "reg_b" and sites[1] in ("reg_a", "reg_b")
    assert sites[2:] == ["global", "reg_a"]


def test_daemon_killed_mid_step_and_restarted_job_completes(cluster: LocalCluster,
                                                             tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    steps = [new_step(ledger_command(seconds, ledger), target="reg_a")
             for seconds in (0.2, 4.0, 0.2)]
    db, job_id = submit(cluster, steps)
    deadline = time.monotonic() + 30
    while not any(row[0] == "start" and row[2] == 1 for row in read_ledger(ledger)):
        assert time.monotonic() < deadline, "step 1 never started"
        time.sleep(0.05)
    os.kill(cluster.daemon_proc("reg_a").pid, signal.SIGKILL)
    cluster.start_daemon("reg_a")

    doc = wait_until_done(db, [job_id], 60)[0]
    assert doc["job_status"] == "success"
    rows = read_ledger(ledger)
    starts = [(row[2], row[4]) for row in rows if row[0] == "start"]
    ends = [row[2] for row in rows if row[0] == "end"]
    # Step 1 ran again after the crash, in a new epoch, and the history says why;
    # the restarted daemon killed the orphaned first run, which never finished.
    assert starts == [(0, 1), (1, 1), (1, 3), (2, 1)]
    assert ends == [0, 1, 2]
    released = [h for h in doc["history"] if h["event"] == "released"]
    assert [(h["step"], h["site"], h["epoch"]) for h in released] == [(1, "reg_a", 2)]


def test_a_site_that_dies_for_good_loses_its_step_to_another_when_its_lease_expires(
        tmp_path: Path) -> None:
    local = LocalCluster(write_sites(tmp_path / "sites", 3, lease=3.0), tmp_path / "state",
                         in_memory=True)
    local.up()
    try:
        ledger = tmp_path / "ledger"
        step = new_step(ledger_command(6.0, ledger), target=["reg_a", "reg_b"])
        db, job_id = submit(local, [step, new_step("true")])
        deadline = time.monotonic() + 30
        while not (starts := [row for row in read_ledger(ledger) if row[0] == "start"]):
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.05)
        doomed = starts[0][3]
        os.kill(local.daemon_proc(doomed).pid, signal.SIGKILL)  # and it never comes back

        doc = wait_until_done(db, [job_id], 60)[0]
        assert doc["job_status"] == "success"
        runs = [(row[3], row[4]) for row in read_ledger(ledger) if row[0] == "start"]
        survivor = "reg_b" if doomed == "reg_a" else "reg_a"
        assert runs[0][0] == doomed and runs[-1][0] == survivor
        assert runs[-1][1] > runs[0][1]  # a later epoch: the dead site's run is fenced off
        revoked = [h for h in doc["history"] if h["event"] == "released"]
        assert revoked and f"lease of {doomed} expired" in revoked[0]["detail"]
        assert revoked[0]["site"] == "global"  # the creator took it back
    finally:
        local.down()


# --- broadcast steps (docs/protocol.md, "Broadcast steps") ----------------------------
# (The nightly-backup example, a schedule's broadcast and a job waiting for it, is below.)

def test_a_broadcast_step_runs_at_every_site_then_the_next_step_at_global(
        cluster: LocalCluster, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    steps = [new_step(ledger_command(0.3, ledger), target="all"),
             new_step(ledger_command(0.1, ledger), target="global")]
    db, job_id = submit(cluster, steps, site="reg_a")
    doc = wait_until_done(db, [job_id], 60)[0]
    rows = read_ledger(ledger)
    audit = audit_run(rows, {job_id: doc}, [job_id])
    assert audit.problems == [] and audit.duplicates == []
    starts = [(row[2], row[3]) for row in rows if row[0] == "start"]
    assert sorted(starts[:3]) == [(0, "global"), (0, "reg_a"), (0, "reg_b")]
    assert starts[3:] == [(1, "global")]
    last_snapshot_end = max(n for n, row in enumerate(rows) if row[:1] == ("end",)
                            and row[2] == 0)
    assert rows.index(("start", job_id, 1, "global", 1)) > last_snapshot_end
    runs = doc["job"][0]["runs"]
    assert {site: (run["status"], run["exit_code"], run["attempts"]) for site, run in
            runs.items()} == dict.fromkeys(("global", "reg_a", "reg_b"), ("finished", 0, 1))
    assert all(run["output"] == {"stdout": "", "stderr": ""} for run in runs.values())


@pytest.mark.parametrize(("policy", "status"), [("all", "failed"), ("any", "success")])
def test_a_site_failing_its_part_decides_the_broadcast_by_its_policy(
        cluster: LocalCluster, policy: str, status: str) -> None:
    fails_at_reg_b = 'echo "snapshot at $JOBDIST_SITE"; [ "$JOBDIST_SITE" != reg_b ]'
    doc = run_job(cluster, [new_step(fails_at_reg_b, target=["reg_a", "reg_b"], each=True,
                                     each_policy=policy, max_retries=1, sleep=0.05),
                            new_step("true", target="global")])
    assert doc["job_status"] == status
    runs = doc["job"][0]["runs"]
    assert (runs["reg_b"]["status"], runs["reg_b"]["exit_code"], runs["reg_b"]["attempts"]) \
        == ("failed", 1, 2)
    assert runs["reg_b"]["output"]["stdout"] == "snapshot at reg_b\n"
    assert runs["reg_a"]["status"] == "finished"
    step_end = next(h for h in doc["history"] if h["step"] == 0 and h["site"] == "global"
                    and h["event"] in ("finished", "failed"))
    assert step_end["event"] == ("failed" if policy == "all" else "finished")
    assert doc["job"][1]["step_status"] == ("finished" if status == "success" else None)


def test_a_site_lost_for_good_is_dropped_from_a_broadcast_and_the_job_goes_on(
        tmp_path: Path) -> None:
    """reg_b dies mid-snapshot: the creator revokes its part's lease, the step waits for
    it, and `jobdist drop-site` at the creator lets the verify step run."""
    local = LocalCluster(write_sites(tmp_path / "sites", 3, lease=3.0), tmp_path / "state",
                         in_memory=True)
    local.up()
    try:
        ledger = tmp_path / "ledger"
        steps = [new_step(ledger_command(4.0, ledger), target="all"),
                 new_step(ledger_command(0.1, ledger), target="global")]
        db, job_id = submit(local, steps)
        deadline = time.monotonic() + 30
        while not any(row[0] == "start" and row[3] == "reg_b" for row in read_ledger(ledger)):
            assert time.monotonic() < deadline, "reg_b never started its part"
            time.sleep(0.05)
        os.kill(local.daemon_proc("reg_b").pid, signal.SIGKILL)  # and it never comes back
        deadline = time.monotonic() + 60
        while not any(h["event"] == "released" for h in db.get(job_id)["history"]):
            assert time.monotonic() < deadline, "the creator never revoked reg_b's lease"
            time.sleep(0.2)
        doc = db.get(job_id)
        assert doc["job_status"] is None and doc["step"] == 0  # it waits for reg_b

        runner = CliRunner(env={"JOBDIST_SITES": str(local.sites_dir), "JOBDIST_SITE": None})
        result = runner.invoke(main, ["drop-site", job_id, "reg_b", "--site", "global",
                                      "--reason", "disk died"])
        assert result.exit_code == 0, result.output
        assert "dropped reg_b from step 0" in result.output

        doc = wait_until_done(db, [job_id], 60)[0]
        assert doc["job_status"] == "success"
        rows = read_ledger(ledger)
        audit = audit_run(rows, {job_id: doc}, [job_id], killed=("reg_b",))
        assert audit.problems == []
        assert doc["job"][0]["dropped"] == ["reg_b"]
        assert any(h["event"] == "dropped" and h["detail"] == "reg_b: disk died"
                   for h in doc["history"])
        assert [row[3] for row in rows if row[0] == "start" and row[2] == 1] == ["global"]
    finally:
        local.down()


# --- waiting: for other jobs (any creator) and for a time ------------------------------

def submit_waiting(cluster: LocalCluster, site: str, steps: list[Doc], **waits: object
                   ) -> tuple[Database, str]:
    db = site_db(cluster, site)
    job = new_job(site, steps, waits=dict(waits))
    db.save(job)
    return db, job["_id"]


def named(doc: Doc, event: str) -> list[Doc]:
    return [entry for entry in doc["history"] if entry["event"] == event]


def test_a_job_waits_for_a_job_another_site_created_and_nobody_takes_it_early(
        cluster: LocalCluster, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    _, first = submit_waiting(cluster, "reg_a", [new_step(ledger_command(2.0, ledger),
                                                          target="reg_b")])
    db, second = submit_waiting(cluster, "global", [new_step(ledger_command(0.1, ledger))],
                                after=[first])
    # While the first runs, every site holds the second as waiting, and none runs it.
    for site in ("reg_a", "reg_b"):
        wait_for(lambda site=site: any(row.id == second for row in client.list_jobs(
            site_db(cluster, site), status="waiting")), timeout=20,
            what=f"{site} lists the job as waiting")
    done = wait_until_done(db, [first, second], 60)
    assert [doc["job_status"] for doc in done] == ["success", "success"]
    rows = read_ledger(ledger)
    assert [(row[0], row[1]) for row in rows] == [
        ("start", first), ("end", first), ("start", second), ("end", second)]
    (ready,) = named(done[1], "ready")
    assert ready["site"] == "global"  # the waiting job's creator decided
    assert ready["detail"] == f"released from wait: {first} success"


@pytest.mark.parametrize(("policy", "expected"), [(None, "failed"), ("always", "success")])
def test_a_failed_dependency_fails_the_waiting_job_naming_it_unless_always(
        cluster: LocalCluster, tmp_path: Path, policy: str | None, expected: str) -> None:
    marker = tmp_path / "ran"
    _, first = submit_waiting(cluster, "reg_b", [new_step("sleep 0.5; exit 4",
                                                          target="reg_a")])
    waits: dict[str, object] = {"after": [first]}
    if policy:
        waits["after_policy"] = policy
    db, second = submit_waiting(cluster, "global", [new_step(f"touch {marker}")], **waits)
    first_doc, second_doc = wait_until_done(db, [first, second], 60)
    assert first_doc["job_status"] == "failed"
    assert second_doc["job_status"] == expected
    assert marker.exists() == (expected == "success")
    if expected == "failed":
        assert named(second_doc, "failed")[-1]["detail"] == \
            f"waited for {first}, which failed"
        assert named(second_doc, "started") == []


def test_a_delayed_job_does_not_start_before_its_time(cluster: LocalCluster,
                                                      tmp_path: Path) -> None:
    started_at = tmp_path / "started"
    not_before = later(utc_now(), 3.0)
    db, job_id = submit_waiting(cluster, "reg_a",
                                [new_step(f"date -u +%s.%N > {started_at}", target="any")],
                                not_before=not_before)
    (doc,) = wait_until_done(db, [job_id], 60)
    assert doc["job_status"] == "success"
    ran_at = datetime.fromtimestamp(float(started_at.read_text()), UTC)
    assert ran_at >= parse_time(not_before)
    assert (ran_at - parse_time(not_before)).total_seconds() < 5  # woken by its timer
    (ready,) = named(doc, "ready")
    assert ready["site"] == "reg_a" and ready["at"] >= not_before


def test_nightly_backup_a_schedule_snapshots_every_site_then_a_job_verifies_at_global(
        cluster: LocalCluster, tmp_path: Path) -> None:
    """The nightly-backup example (docs/job-document.md, "Waiting for other jobs and
    for a time"): a schedule's job snapshots every site; a job at global waits for that
    tick's job (its id is known before the tick: it waits for a job not there yet) and
    verifies. The snapshot is one broadcast step (docs/protocol.md, "Broadcast steps")."""
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir()
    changed = later(utc_now(), -61)  # the owner makes the latest tick at once (missed: latest)
    snapshot = f"touch {snapshots}/$JOBDIST_SITE"
    doc = new_schedule("nightly", "* * * * *", "global",
                       {"job": [{"do": snapshot, "target": "all"}]}, now=changed)
    tick = list(ticks(doc, changed, utc_now()))[-1]  # made on time or as the latest missed
    backup = tick_job_id("nightly", tick)
    verify = f"test -e {snapshots}/global && test -e {snapshots}/reg_a && test -e {snapshots}/reg_b"
    db, verifier = submit_waiting(cluster, "global", [new_step(verify, target="global")],
                                  after=[backup])
    site_db(cluster, "global").save(doc)
    backup_doc, verify_doc = wait_until_done(db, [backup, verifier], 60)
    assert (backup_doc["job_status"], verify_doc["job_status"]) == ("success", "success")
    (ready,) = named(verify_doc, "ready")
    assert ready["at"] >= max(h["at"] for h in named(backup_doc, "finished"))
    assert [h["site"] for h in named(verify_doc, "started")] == ["global"]
    runs = backup_doc["job"][0]["runs"]
    assert {site: run["status"] for site, run in runs.items()} == dict.fromkeys(
        ("global", "reg_a", "reg_b"), "finished")
    # released after the broadcast step ended: its creator's `finished` at global
    assert ready["at"] >= next(h["at"] for h in named(backup_doc, "finished")
                               if h["site"] == "global" and h["worker"] is None)
