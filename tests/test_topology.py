"""Topologies (mesh, star) and filtered replication, alone and on real sites."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from jobdist.cli import main
from jobdist.config import load_sites
from jobdist.design import load_design_docs
from jobdist.lab.cluster import LocalCluster
from jobdist.lab.localserver import LocalServer, free_port
from jobdist.lab.scenarios import (
    THESIS_SCENARIOS,
    check_ledger,
    run_scenario,
    site_db,
    wait_until_done,
    write_sites,
)
from jobdist.model import new_job, new_step
from jobdist.setup import admin_couch_of
from jobdist.topology import (
    COUCHDB_REPLICATION_SETTINGS,
    EVERY_JOB,
    EVERY_JOB_SELECTOR,
    JOBS_FOR_SITE,
    MESH_SITES_MAX,
    Replication,
    ServerKind,
    full_mesh_warning,
    jobs_for_site_selector,
    replication_doc,
    replications,
)

REPO_SITES = Path(__file__).resolve().parent.parent / "sites"


def links(sites_dir: Path) -> set[tuple[str, str, str]]:
    return {(r.source.name, r.target.name, r.filter.split("/")[1])
            for r in replications(load_sites(sites_dir))}


def test_the_shipped_mesh_replicates_every_pair_both_ways() -> None:
    assert len(links(REPO_SITES)) == 6
    assert all(kind == "jobs" for _, _, kind in links(REPO_SITES))


def test_the_shipped_star_has_a_hub_that_gets_everything_and_filters_what_it_passes_on() -> None:
    assert links(REPO_SITES / "star") == {
        ("global", "reg_a", "for_site"), ("global", "reg_b", "for_site"),
        ("reg_a", "global", "jobs"), ("reg_b", "global", "jobs"),
    }


@pytest.mark.parametrize(("topology", "count", "expected"),
                         [("mesh", 5, 20), ("filtered", 5, 20), ("star", 5, 8)])
def test_replication_links_grow_as_the_topology_says(tmp_path: Path, topology: str,
                                                      count: int, expected: int) -> None:
    assert len(links(write_sites(tmp_path, count, topology=topology))) == expected


@pytest.mark.parametrize(("topology", "count", "warned"),
                         [("mesh", 3, False), ("mesh", 4, True), ("filtered", 4, True),
                          ("star", 4, False), ("star", 9, False)])
def test_a_full_mesh_past_three_sites_is_warned_of(tmp_path: Path, topology: str, count: int,
                                                    warned: bool) -> None:
    assert MESH_SITES_MAX == 3
    warning = full_mesh_warning(load_sites(write_sites(tmp_path, count, topology=topology)))
    assert (warning is not None) == warned
    if warning is not None:
        assert warning.startswith(f"{count} sites in a full mesh")


def sites_on_one_server(directory: Path, url: str, peers: dict[str, list[str]]) -> Path:
    """Sites whose databases share one server, each pushing to `peers[name]`."""
    directory.mkdir()
    for name, pushed_to in peers.items():
        (directory / f"{name}.toml").write_text(
            f'name = "{name}"\npeers = [{", ".join(chr(34) + p + chr(34) for p in pushed_to)}]\n'
            f'[couch]\nurl = "{url}"\ndatabase = "jobs_{name}"\n')
    return directory


def test_setup_warns_once_of_a_full_mesh_past_three_sites_and_sets_it_up(
        tmp_path: Path) -> None:
    server = LocalServer(free_port(), tmp_path / "couch", in_memory=True)
    names = ["s1", "s2", "s3", "s4"]
    mesh = {name: [p for p in names if p != name] for name in names}
    star = {"h": ["a", "b", "c"], "a": ["h"], "b": ["h"], "c": ["h"]}
    try:
        server.start()
        for label, peers in (("mesh", mesh), ("star", star)):
            sites = sites_on_one_server(tmp_path / label, server.url, peers)
            result = CliRunner().invoke(main, ["setup", "--sites", str(sites)])
            assert result.exit_code == 0, result.output
            warned = [line for line in result.stderr.splitlines() if "full mesh" in line]
            expected = full_mesh_warning(load_sites(sites))
            assert warned == ([] if expected is None else [f"jobdist: {expected}"])
            assert (expected is None) == (label == "star")
            assert "setup: " in result.stdout  # a warning, not an error: set up all the same
    finally:
        server.stop()


def test_unknown_topology_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown topology"):
        write_sites(tmp_path, 3, topology="ring")


def test_for_site_filter_passes_only_jobs_that_concern_the_site(db_url: str) -> None:
    design = load_design_docs()[0]
    requests.put(f"{db_url}/{design['_id']}", json=design, timeout=10).raise_for_status()
    jobs = {
        "mine": new_job("reg_b", [new_step("true", target="global")]),
        "any": new_job("global", [new_step("true")]),
        "listed": new_job("global", [new_step("true", target=["reg_a", "reg_b"])]),
        "elsewhere": new_job("global", [new_step("true", target="reg_a"),
                                        new_step("true", target="global")]),
    }
    for job in jobs.values():
        requests.put(f"{db_url}/{job['_id']}", json=job, timeout=10).raise_for_status()
    gone = jobs["elsewhere"]["_id"] + "-deleted"
    rev = requests.put(f"{db_url}/{gone}", json=new_job("global", [new_step("x")], job_id=gone),
                       timeout=10).json()["rev"]
    requests.delete(f"{db_url}/{gone}", params={"rev": rev}, timeout=10).raise_for_status()
    changes = requests.get(f"{db_url}/_changes",
                           params={"filter": JOBS_FOR_SITE, "site": "reg_b"}, timeout=10).json()
    passed = {row["id"] for row in changes["results"]}
    assert passed == {jobs["mine"]["_id"], jobs["any"]["_id"], jobs["listed"]["_id"], gone}


def star_links() -> dict[tuple[str, str], Replication]:
    links = replications(load_sites(REPO_SITES / "star"))
    return {(link.source.name, link.target.name): link for link in links}


def test_a_couchdb_site_replicates_by_selector_with_urls_at_both_ends() -> None:
    links = star_links()
    to_spoke = replication_doc(links[("global", "reg_a")], ServerKind.COUCHDB)
    assert to_spoke == {
        "source": links[("global", "reg_a")].source_endpoint,
        "target": links[("global", "reg_a")].target_endpoint,
        "continuous": True, "selector": jobs_for_site_selector("reg_a"),
        **COUCHDB_REPLICATION_SETTINGS}
    assert to_spoke["source"].startswith("http")
    to_hub = replication_doc(links[("reg_a", "global")], ServerKind.COUCHDB)
    assert to_hub["selector"] == EVERY_JOB_SELECTOR
    assert not {"filter", "query_params", "checkpoint"} & (to_spoke.keys() | to_hub.keys())


def test_a_pouchdb_site_replicates_by_javascript_filter_from_its_database_by_name() -> None:
    links = star_links()
    to_spoke = replication_doc(links[("global", "reg_a")], ServerKind.POUCHDB)
    assert to_spoke == {
        "source": "jobs", "target": links[("global", "reg_a")].target_endpoint,
        "continuous": True, "filter": JOBS_FOR_SITE, "query_params": {"site": "reg_a"},
        "checkpoint": False}
    to_hub = replication_doc(links[("reg_a", "global")], ServerKind.POUCHDB)
    assert (to_hub["filter"], "query_params" in to_hub) == (EVERY_JOB, False)
    assert "selector" not in to_spoke.keys() | to_hub.keys()


def step_targeting(target: object) -> dict[str, object]:
    """A step whose target is `target`; None: the field left out."""
    step = new_step("true")
    del step["target"]
    return step if target is None else step | {"target": target}


SELECTOR_CASES: dict[str, dict[str, object]] = {
    "mine": new_job("reg_b", [step_targeting("global")]),
    "any": new_job("global", [step_targeting("any")]),
    "no target": new_job("global", [step_targeting(None)]),
    "null target": new_job("global", [step_targeting("global") | {"target": None}]),
    "all": new_job("global", [step_targeting("all")]),
    "named": new_job("global", [step_targeting("global"), step_targeting("reg_b")]),
    "listed": new_job("global", [step_targeting(["reg_a", "reg_b"])]),
    "listed any": new_job("global", [step_targeting(["reg_a", "any"])]),
    "elsewhere": new_job("global", [step_targeting("reg_a"), step_targeting(["global"])]),
    "site": {"_id": "site:reg_a", "type": "site"},
    "schedule": {"_id": "schedule:x", "type": "schedule"},
    "other": {"_id": "other", "type": "note", "creator": "reg_b"},
    "untyped": {"_id": "untyped"},
}


@pytest.mark.parametrize(("filter_name", "selector"),
                         [(JOBS_FOR_SITE, jobs_for_site_selector("reg_b")),
                          (EVERY_JOB, EVERY_JOB_SELECTOR)], ids=["for_site", "jobs"])
def test_each_selector_passes_what_its_javascript_filter_passes(
        db_url: str, filter_name: str, selector: dict[str, object]) -> None:
    """pouchdb-server evaluates selectors in `_find` (its replicator cannot take one):
    the same Mango language CouchDB's replicator evaluates. `_find` leaves deletions
    out; the selectors pass them by `_deleted`, which only a deletion has. Without
    the validator: a target left out or null is malformed but has its default."""
    design = {**load_design_docs()[0]}
    del design["validate_doc_update"]
    requests.put(f"{db_url}/{design['_id']}", json=design, timeout=10).raise_for_status()
    for doc in SELECTOR_CASES.values():
        requests.put(f"{db_url}/{doc['_id']}", json=doc, timeout=10).raise_for_status()
    changes = requests.get(f"{db_url}/_changes",
                           params={"filter": filter_name, "site": "reg_b"}, timeout=10).json()
    found = requests.post(f"{db_url}/_find", json={"selector": selector, "limit": 1000},
                          timeout=10).json()
    by_filter = {row["id"] for row in changes["results"]}
    names = {doc["_id"]: name for name, doc in SELECTOR_CASES.items()}
    assert {names[doc["_id"]] for doc in found["docs"]} == {names[i] for i in by_filter}
    passed = {name for name, doc in SELECTOR_CASES.items() if doc["_id"] in by_filter}
    if filter_name == JOBS_FOR_SITE:
        assert passed == {"mine", "any", "no target", "null target", "all", "named", "listed",
                          "listed any", "site", "schedule"}
    else:
        assert passed == set(SELECTOR_CASES) - {"other", "untyped"}


@pytest.mark.e2e
@pytest.mark.parametrize("scenario", [THESIS_SCENARIOS[3], THESIS_SCENARIOS[4]],
                         ids=["2: 3 sites", "3: targets A,B,A"])
def test_star_topology_runs_the_thesis_scenarios(scenario, tmp_path: Path) -> None:
    result = run_scenario(scenario, step_seconds=0.2, work_dir=tmp_path, topology="star")
    assert check_ledger(result) == []
    assert result.statuses == {"success": scenario.jobs}


@pytest.mark.e2e
def test_filtered_mesh_keeps_a_targeted_job_away_from_sites_it_does_not_concern(
        tmp_path: Path) -> None:
    cluster = LocalCluster(write_sites(tmp_path / "sites", 3, topology="filtered"),
                           tmp_path / "state", in_memory=True)
    cluster.up()
    try:
        global_db = site_db(cluster, "global")
        targeted = new_job("global", [new_step("true", target="reg_a"),
                                      new_step("true", target="global")])
        anywhere = new_job("global", [new_step("true")])
        global_db.bulk_docs([targeted, anywhere])
        done = wait_until_done(global_db, [targeted["_id"], anywhere["_id"]], 60)
        assert [doc["job_status"] for doc in done] == ["success", "success"]
        assert wait_until_done(site_db(cluster, "reg_b"), [anywhere["_id"]], 30)
        assert site_db(cluster, "reg_b").get(targeted["_id"]) is None
        reg_a_view = wait_until_done(site_db(cluster, "reg_a"), [targeted["_id"]], 30)
        assert reg_a_view[0]["job_status"] == "success"
        assert site_db(cluster, "reg_b").get(targeted["_id"]) is None
    finally:
        cluster.down()


@pytest.mark.e2e
def test_a_cluster_brought_up_again_in_another_topology_replicates_as_the_new_one_says(
        tmp_path: Path) -> None:
    """The servers keep their data (on disk) across `down` and `up`; the replications of
    the mesh are running documents pouchdb-server will not edit: `up` starts afresh."""
    state = tmp_path / "state"
    with LocalCluster(write_sites(tmp_path / "mesh", 3, topology="mesh"), state):
        pass
    star = write_sites(tmp_path / "star", 3, topology="star")
    shutil.copytree(tmp_path / "mesh" / "secrets", star / "secrets")  # the same users
    with LocalCluster(star, state) as cluster:
        job = new_job("global", [new_step("true", target="reg_b")])
        site_db(cluster, "global").save(job)
        done = wait_until_done(site_db(cluster, "global"), [job["_id"]], 60)
        assert done[0]["job_status"] == "success"
        rows = admin_couch_of(cluster.sites["global"]).database("_replicator").all_docs()
        assert {row["id"] for row in rows if row["id"].startswith("jobdist-")} == {
            "jobdist-global-to-reg_a", "jobdist-global-to-reg_b"}
