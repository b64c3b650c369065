"""A creator site lost for good: another site adopts its jobs, which then end.

Without its creator a job's claims on `any` steps wait forever (nobody else
may pick a winner). `jobdist adopt --from global --site reg_a` hands the
arbitration to reg_a; every job then ends, each step run once. With
`[succession]` configured, reg_a does so by itself once global is silent.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobdist.cli import main
from jobdist.lab.audit import read_ledger
from jobdist.lab.cluster import LocalCluster
from jobdist.lab.scenarios import ledger_command, site_db, submit_all, wait_until_done, write_sites
from jobdist.model import new_step

from .helpers import wait_for

pytestmark = pytest.mark.e2e


def creator_gone_before_deciding(cluster: LocalCluster, ledger: Path) -> list[str]:
    """Jobs submitted at global, whose daemon is gone before it decides anything; its
    server lives just long enough to replicate them to reg_a, then goes too."""
    steps = [new_step(ledger_command(0.2, ledger)) for _ in range(2)]
    cluster.daemon_proc("global").stop()
    ids = submit_all(site_db(cluster, "global"), "global", steps, 4)
    reg_a = site_db(cluster, "reg_a")
    wait_for(lambda: len(reg_a.bulk_get(ids)) == len(ids), 30.0, "the jobs replicate to reg_a")
    cluster.stop_site("global")
    return ids


def assert_each_step_ran_once(ids: list[str], ledger: Path) -> None:
    runs = collections.Counter((job, step) for kind, job, step, _, _ in read_ledger(ledger)
                               if kind == "start")
    assert set(runs) == {(job_id, step) for job_id in ids for step in (0, 1)}
    assert set(runs.values()) == {1}


def test_a_successor_takes_over_the_jobs_of_a_silent_creator_by_itself(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    sites = write_sites(tmp_path / "sites", 3, keepalive=1.0, stale_after=2.0, lease=6.0,
                        successors={"global": ["reg_a", "reg_b"]}, creator_timeout=5.0)
    with LocalCluster(sites, tmp_path / "state", in_memory=True) as cluster:
        ids = creator_gone_before_deciding(cluster, ledger)
        docs = wait_until_done(site_db(cluster, "reg_b"), ids, 60)
    assert collections.Counter(doc["job_status"] for doc in docs) == {"success": 4}
    assert all(doc["creator"] == "reg_a" for doc in docs)
    for doc in docs:
        [adopted] = [h for h in doc["history"] if h["event"] == "adopted"]
        assert (adopted["site"], adopted["epoch"]) == ("reg_a", 1)
        assert adopted["detail"] == ("creator global -> reg_a: no status from global for 5 s "
                                     "(automatic succession)")
    assert_each_step_ran_once(ids, ledger)


def test_a_site_adopts_the_jobs_of_a_creator_gone_for_good(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    sites = write_sites(tmp_path / "sites", 3, keepalive=1.0, stale_after=2.0, lease=6.0)
    with LocalCluster(sites, tmp_path / "state", in_memory=True) as cluster:
        ids = creator_gone_before_deciding(cluster, ledger)
        reg_a = site_db(cluster, "reg_a")
        time.sleep(3.0)  # claims are made, and wait for a creator that is gone
        assert not any(doc.get("job_status") for doc in reg_a.bulk_get(ids))

        result = CliRunner().invoke(main, ["adopt", "--from", "global", "--sites", str(sites),
                                           "--site", "reg_a"])
        assert result.exit_code == 0, result.output
        assert "reg_a adopted 4 live jobs created by global" in result.output
        docs = wait_until_done(reg_a, ids, 60)
    assert collections.Counter(doc["job_status"] for doc in docs) == {"success": 4}
    assert all(doc["creator"] == "reg_a" for doc in docs)
    assert_each_step_ran_once(ids, ledger)


def test_a_site_cannot_adopt_its_own_jobs(tmp_path: Path) -> None:
    sites = write_sites(tmp_path / "sites", 1)
    result = CliRunner().invoke(main, ["adopt", "--from", "global", "--sites", str(sites),
                                       "--site", "global"])
    assert result.exit_code == 2
    assert "cannot adopt its own jobs" in result.output



@pytest.mark.parametrize("gone", ["", "Global", "reg a", "x" * 65])
def test_adopt_refuses_a_name_no_site_can_have(tmp_path: Path, gone: str) -> None:
    sites = write_sites(tmp_path / "sites", 1)
    result = CliRunner().invoke(main, ["adopt", "--from", gone, "--sites", str(sites),
                                       "--site", "global"])
    assert result.exit_code == 2
    assert result.output.startswith(f"jobdist: --from {gone!r}: must be a site name")
    assert len(result.output.splitlines()) == 1
