"""`jobdist bench --deployment DIR` on real sites brought up as `jobdist cluster up` does
(on-disk pouchdb-servers and their daemons), and setup's replications scoped by database.

The deployment must come out as it went in: its `jobs` database, documents and
replications untouched, no bench database or bench replication left behind.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from jobdist.cli import main
from jobdist.config import SiteConfig, load_sites
from jobdist.couch import Couch
from jobdist.lab.bench.throughput import RAW_DATABASE
from jobdist.lab.cluster import LocalCluster
from jobdist.lab.deployment import BENCH_DATABASE, remove_bench_database, write_bench_sites
from jobdist.lab.localserver import answers
from jobdist.lab.scenarios import site_db, submit_all, wait_until_done, write_sites
from jobdist.model import new_step
from jobdist.setup import admin_couch_of, owned_replications, setup_sites

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two sites, on disk, with a finished job in their `jobs` database."""
    root = tmp_path_factory.mktemp("deployment")
    with LocalCluster(write_sites(root / "sites", 2), root / "state") as cluster:
        db = site_db(cluster, "global")
        wait_until_done(db, submit_all(db, "global", [new_step("true")], 2), 60)
        yield cluster


def admin(site: SiteConfig) -> Couch:
    return admin_couch_of(site)


def replications(site: SiteConfig) -> dict[str, dict[str, Any]]:
    """The site's replication documents, as written (not the replicator's state)."""
    rows = admin(site).replicator().all_docs(include_docs=True)
    return {row["id"]: {k: v for k, v in row["doc"].items() if not k.startswith("_")}
            for row in rows if not row["id"].startswith("_design/")}


def jobs_documents(site: SiteConfig) -> dict[str, str]:
    """Every document of the `jobs` database but the sites' status (their daemons rewrite
    them), by id, with its revision."""
    rows = admin(site).database("jobs").all_docs()
    return {row["id"]: row["value"]["rev"] for row in rows if not row["id"].startswith("site:")}


def snapshot(sites: dict[str, SiteConfig]) -> dict[str, Any]:
    return {name: (replications(site), jobs_documents(site),
                   admin(site).database("jobs").security()) for name, site in sites.items()}


def leftovers(sites: dict[str, SiteConfig]) -> list[str]:
    """What the bench may leave: its databases, its replication documents."""
    found = []
    for site in sites.values():
        couch = admin(site)
        found += [f"{site.name} {db}" for db in (BENCH_DATABASE, RAW_DATABASE)
                  if couch.database(db).exists()]
        found += [f"{site.name} {doc_id}" for doc_id in replications(site)
                  if not doc_id.startswith("jobdist-")]
    return found


def test_setup_of_a_second_database_keeps_the_jobs_replications_and_its_removal_too(
        deployment: LocalCluster, tmp_path: Path) -> None:
    sites = deployment.sites
    before = {name: replications(site) for name, site in sites.items()}
    assert set(before["global"]) == {"jobdist-global-to-reg_a"}
    bench = load_sites(write_bench_sites(sites, tmp_path / "bench", {"global": 1, "reg_a": 1},
                                         5.0))
    for _ in range(2):  # each set up, then again: stale removal runs every time
        setup_sites(bench)
        setup_sites(sites)
    for name, site in sites.items():
        found = replications(site)
        ours = f"jobdist:{BENCH_DATABASE}:{name}-to-{site.peers[0]}"
        assert set(found) == {*before[name], ours}
        assert found[ours]["source"] == BENCH_DATABASE
        assert all(found[doc_id] == doc for doc_id, doc in before[name].items())
    remove_bench_database(bench, print)
    assert {name: replications(site) for name, site in sites.items()} == before
    assert leftovers(sites) == []
    assert all(answers(site.couch.url) for site in sites.values())  # pouchdb-server lives


def test_throughput_measures_a_deployment_and_leaves_it_as_it_was(
        deployment: LocalCluster) -> None:
    sites = deployment.sites
    before = snapshot(sites)
    result = CliRunner().invoke(main, ["bench", "--deployment", str(deployment.sites_dir),
                                       "throughput", "--jobs", "20", "--raw-writes", "20"])
    assert result.exit_code == 0, result.output
    assert "steps/s (until all seen done at global)" in result.output
    assert "jobs ok" in result.output and "20/20" in result.output
    servers = result.output[result.output.index("servers:"):]
    assert f"deployment {deployment.sites_dir}" in servers
    for name, site in sites.items():
        assert f"{name} pouchdb-server 4.2.0 at {site.couch.url}" in " ".join(servers.split())
    assert "on disk" not in servers
    assert snapshot(sites) == before
    assert leftovers(sites) == []
    for name in sites:  # the deployment's own daemons run on
        assert deployment.daemon_proc(name).alive()


def test_a_bad_deployment_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["bench", "--deployment", str(tmp_path / "nowhere"),
                                       "throughput", "--jobs", "2"])
    assert result.exit_code != 0
    assert result.stderr.splitlines() == [
        f"jobdist: --deployment: {tmp_path / 'nowhere'}: no such sites directory"]
    assert "Traceback" not in result.output


def test_benches_that_cannot_measure_a_deployment_say_why(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["bench", "--deployment", str(tmp_path), "memory"])
    assert result.exit_code != 0
    assert result.stderr.startswith("jobdist: bench memory cannot measure a deployment: ")
    assert len(result.stderr.splitlines()) == 1


def test_thesis_runs_the_scenarios_the_deployment_has_sites_for(
        deployment: LocalCluster) -> None:
    """Scenario 3 targets global and reg_a by name: the deployment's first two sites."""
    sites = deployment.sites
    before = snapshot(sites)
    result = CliRunner().invoke(main, ["bench", "--deployment", str(deployment.sites_dir),
                                       "thesis", "--only", "3", "--step-seconds", "0.2",
                                       "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["servers"].startswith(f"deployment {deployment.sites_dir}: global "
                                        "pouchdb-server 4.2.0")
    [row] = report["scenarios"]
    assert (row["jobs_ok"], row["problems"]) == (3, [])
    assert snapshot(sites) == before
    assert leftovers(sites) == []


def test_setup_takes_over_the_old_ids_of_the_database_it_pushes(
        deployment: LocalCluster) -> None:
    """Before ids named their database, every database's were `jobdist-A-to-B`: a
    database's setup counts those that push it as its own (to replace or remove)."""
    replicator = admin(deployment.sites["global"]).replicator()
    nowhere = "http://127.0.0.1:9"  # nothing listens: the replication just fails
    replicator.save({"_id": "jobdist-old-to-peer", "source": f"{nowhere}/otherdb",
                     "target": f"{nowhere}/otherdb", "continuous": True})
    assert "jobdist-old-to-peer" in owned_replications(replicator, "otherdb")
    assert "jobdist-old-to-peer" not in owned_replications(replicator, "jobs")
    assert owned_replications(replicator, "jobs") == ["jobdist-global-to-reg_a"]
    assert owned_replications(replicator, BENCH_DATABASE) == []
