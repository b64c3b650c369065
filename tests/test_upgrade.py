"""Upgrading one site at a time: sites of the previous release and of this one run
side by side, jobs flowing throughout, and nothing is lost (docs/operations.md,
"Upgrading").

The previous release is this repository at PREVIOUS_RELEASE, unpacked with
`git archive`; its daemons and its setup run from there (PYTHONPATH, and
PYTHONSAFEPATH so that the current directory's jobdist is not imported first).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from jobdist.design import DDOC, DESIGN_VERSION, VERSION_FIELD
from jobdist.lab.audit import audit_run, read_ledger
from jobdist.lab.cluster import LocalCluster
from jobdist.lab.scenarios import ledger_command, site_db, submit_all, wait_until_done, write_sites
from jobdist.model import new_step
from jobdist.setup import admin_couch_of, setup_sites

pytestmark = pytest.mark.e2e

# The last release before job formats and design versions: what deployed sites run.
PREVIOUS_RELEASE = "b45aea2"
REPOSITORY = Path(__file__).resolve().parent.parent
SITES = ("global", "reg_a", "reg_b")


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's source tree, from this repository's history."""
    archive = subprocess.run(["git", "-C", str(REPOSITORY), "archive", "--format=tar",
                              PREVIOUS_RELEASE], capture_output=True, check=False)
    if archive.returncode != 0:
        pytest.skip(f"release {PREVIOUS_RELEASE} is not in this clone's history "
                    f"({archive.stderr.decode(errors='replace').strip()})")
    root = tmp_path_factory.mktemp("previous-release")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(root, filter="data")
    return root


def release_env(source: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(source), "PYTHONSAFEPATH": "1"}


def run_previous_setup(source: Path, sites: Path) -> None:
    """The previous release's `jobdist setup` for every site, as its operators ran it."""
    done = subprocess.run([sys.executable, "-m", "jobdist", "setup", "--sites", str(sites)],
                          env={**os.environ, **release_env(source)}, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def design_version_at(cluster: LocalCluster, name: str) -> int | None:
    site = cluster.sites[name]
    doc = admin_couch_of(site).database(site.couch.database).get(f"_design/{DDOC}")
    assert doc is not None
    return doc.get(VERSION_FIELD)


def upgrade(cluster: LocalCluster, name: str) -> None:
    """docs/operations.md's procedure: stop the daemon, set the site up, start it."""
    cluster.daemon_proc(name).stop()
    setup_sites(cluster.sites, [cluster.sites[name]])
    cluster.start_daemon(name)


def submit_everywhere(cluster: LocalCluster, ledger: Path) -> list[str]:
    """At each site, jobs whose steps go anywhere, to every site, and to one site."""
    ids = []
    for creator in SITES:
        steps = [new_step(ledger_command(0.2, ledger)),
                 new_step(ledger_command(0.1, ledger), target="all"),
                 new_step(ledger_command(0.1, ledger), target="reg_b")]
        ids += submit_all(site_db(cluster, creator), creator, steps, 3)
    return ids


def test_sites_upgraded_one_at_a_time_lose_nothing(previous_release: Path,
                                                   tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    sites = write_sites(tmp_path / "sites", 3, keepalive=1.0, stale_after=2.0, lease=10.0)
    with LocalCluster(sites, tmp_path / "state") as cluster:
        # Every site on the previous release, as deployed today.
        for name in SITES:
            cluster.daemon_proc(name).stop()
        run_previous_setup(previous_release, sites)
        for name in SITES:
            cluster.start_daemon(name, env=release_env(previous_release))
            environ = Path(f"/proc/{cluster.daemon_proc(name).pid}/environ").read_bytes()
            assert f"PYTHONPATH={previous_release}".encode() in environ.split(b"\0")
        assert {design_version_at(cluster, name) for name in SITES} == {None}

        submitted = submit_everywhere(cluster, ledger)
        upgrade(cluster, "reg_b")  # while those jobs run
        submitted += submit_everywhere(cluster, ledger)
        wait_until_done(site_db(cluster, "global"), submitted, 120)
        assert [design_version_at(cluster, name) for name in SITES] == [
            None, None, DESIGN_VERSION]

        for name in ("global", "reg_a"):
            submitted += submit_everywhere(cluster, ledger)
            upgrade(cluster, name)
        submitted += submit_everywhere(cluster, ledger)
        docs = wait_until_done(site_db(cluster, "reg_a"), submitted, 120)
        assert {design_version_at(cluster, name) for name in SITES} == {DESIGN_VERSION}

    audit = audit_run(read_ledger(ledger), {doc["_id"]: doc for doc in docs}, submitted)
    assert audit.ok, audit.problems
    ran_at = {site for _, _, _, site, _ in read_ledger(ledger)}
    assert ran_at == set(SITES)
