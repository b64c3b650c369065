"""Sites as separate hosts: each site's server and daemon in a network namespace
of its own (jobdist.lab.netns), a partition a link taken down, not a proxy.

Skips, saying why, where namespaces cannot be made (not root, no `ip`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from jobdist.client import read_merged_many
from jobdist.couch import Saved
from jobdist.lab import netns
from jobdist.lab.audit import audit_run, read_ledger
from jobdist.lab.cluster import LocalCluster
from jobdist.lab.netns import HostNetwork
from jobdist.lab.scenarios import ledger_command, site_db, site_names, wait_until_done, write_sites
from jobdist.model import Doc, Phase, new_job, new_step, step_phase

from .helpers import wait_for

WHY_NOT = netns.unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"sites as hosts: {WHY_NOT}")

LEASE = 6.0  # write_sites derives heartbeat 1.5 s and clock-skew margin 1 s from it


@contextmanager
def host_sites(tmp_path: Path, **options: Any) -> Iterator[tuple[LocalCluster, HostNetwork]]:
    """Three sites, each a host of its own; every process and namespace gone after."""
    with HostNetwork(site_names(3)) as network:
        sites_dir = write_sites(tmp_path / "sites", 3, hosts=network.addresses, **options)
        with LocalCluster(sites_dir, tmp_path / "state", in_memory=True,
                          network=network) as cluster:
            yield cluster, network


def submit(cluster: LocalCluster, steps_of_each: list[list[Doc]]) -> list[str]:
    docs = [new_job("global", steps) for steps in steps_of_each]
    assert all(isinstance(r, Saved) for r in site_db(cluster, "global").bulk_docs(docs))
    return [doc["_id"] for doc in docs]


def net_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def test_each_site_runs_on_a_host_of_its_own(tmp_path: Path) -> None:
    """Every daemon, server and step command runs in its site's namespace; the sites
    reach each other only through their addresses, and jobs flow as on one host."""
    with host_sites(tmp_path, workers=1) as (cluster, network):
        spaces = {site: net_namespace(cluster.daemon_proc(site).pid) for site in cluster.sites}
        assert len(set(spaces.values()) | {net_namespace(os.getpid())}) == 4
        for site in cluster.sites:
            assert net_namespace(cluster.server_pid(site)) == spaces[site]
        ids = submit(cluster, [[new_step("readlink /proc/self/ns/net", target=site)]
                               for site in sorted(cluster.sites)])
        for doc in wait_until_done(site_db(cluster, "global"), ids, 60):
            [step] = doc["job"]
            assert doc["job_status"] == "success", doc["history"]
            assert step["output"]["stdout"].strip() == spaces[step["winner"]]
            assert step["winner"] == step["target"]
        # The other sites saw every job end: replication crossed the bridge.
        for site in ("reg_a", "reg_b"):
            wait_until_done(site_db(cluster, site), ids, 30)
        assert set(network.addresses.values()) == {
            cluster.sites[site].couch.url.split("//")[1].split(":")[0] for site in cluster.sites}


def test_a_site_whose_link_is_down_longer_than_the_lease_loses_its_step(
        tmp_path: Path) -> None:
    """reg_a's link goes down while it runs a step: the creator revokes the lease after
    it and the step runs again at reg_b. Healed, the two runs merge into one result:
    every run is in the history, one counted, the other explained; nothing lost."""
    ledger = tmp_path / "ledger.txt"
    with host_sites(tmp_path, workers=1, lease=LEASE, booking_timeout=LEASE) as (cluster,
                                                                                 network):
        first = new_step(ledger_command(0.2, ledger), target="reg_a")
        shared = new_step(ledger_command(3 * LEASE, ledger), target=["reg_a", "reg_b"])
        [job_id] = submit(cluster, [[first, shared]])
        global_db = site_db(cluster, "global")

        def running_at_reg_a() -> bool:
            step = global_db.get(job_id)["job"][1]
            return step.get("winner") == "reg_a" and step_phase(step) == Phase.RUNNING

        # reg_a runs the first step, so it is the one with room for the second.
        wait_for(running_at_reg_a, 60, "the long step to run at reg_a")
        network.cut("reg_a")
        cut_at = time.monotonic()
        wait_for(lambda: global_db.get(job_id)["job"][1].get("winner") == "reg_b",
                 4 * LEASE, "the creator to give the step to reg_b")
        assert time.monotonic() - cut_at >= LEASE  # not before the lease ran out
        network.restore("reg_a")
        for site in cluster.sites:
            wait_until_done(site_db(cluster, site), [job_id], 6 * LEASE)
        docs = read_merged_many(global_db, [job_id])
        audit = audit_run(read_ledger(ledger), docs, [job_id])
        assert audit.problems == [], audit.problems
        assert len(audit.duplicates) == 1 and "lease of reg_a expired" in audit.duplicates[0]
        events = [entry["event"] for entry in docs[job_id]["history"]]
        assert "released" in events
