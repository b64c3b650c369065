"""Partitions: replication links cut through fault proxies, and the creator's site down."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jobdist.clock import seconds_between, utc_now
from jobdist.lab.audit import read_ledger
from jobdist.lab.faultlog import Fault
from jobdist.lab.faults import LEASE, Trial, trial
from jobdist.lab.proxy import LinkShape
from jobdist.lab.scenarios import Link, ledger_command, regions_apart
from jobdist.model import Doc, Phase, new_step, step_phase

from ..helpers import wait_for

# A link that still carries data, slowly: 300 ms each way and 20 kB a second.
SLOW = LinkShape(0.3, 0.1, 20_000.0)

pytestmark = pytest.mark.faults

MARGIN = LEASE / 6  # what write_sites sets


def links_of(run: Trial, site: str) -> list[Link]:
    return [link for link in run.links if site in link]


@dataclass(frozen=True)
class Partition:
    kind: str  # what the summary counts
    sites: tuple[str, ...]
    detail: str
    links: list[Link]
    seconds: float
    slow: bool = False  # delay the links instead of cutting them

    def begin(self, run: Trial) -> None:
        for link in self.links:
            if self.slow:
                run.links[link].shape(SLOW)
            else:
                run.links[link].cut()

    def end(self, run: Trial) -> None:
        for link in self.links:
            run.links[link].shape(regions_apart(link))
            run.links[link].restore()


def random_partition(run: Trial, kind: str) -> Partition:
    """A pair of sites cut off from each other, a site cut off from all (long
    enough for its leases to lapse), or every link slowed down."""
    sites = sorted(run.cluster.sites)
    if kind == "pair cut":
        a, b = run.rng.sample(sites, 2)
        return Partition(kind, (a, b), f"{a}-{b}", [(a, b), (b, a)], run.rng.uniform(3.0, 9.0))
    if kind == "site isolated, past the lease":
        site = run.rng.choice(sites)
        return Partition(kind, (site,), site, links_of(run, site),
                         run.rng.uniform(LEASE + 2, LEASE + 6))
    return Partition(kind, tuple(sites), "all", list(run.links), run.rng.uniform(3.0, 6.0),
                     slow=True)


def test_replication_cut_and_restored_through_fault_proxies(
        tmp_path: Path, fault_summary: list[dict[str, Any]]) -> None:
    with trial("replication cut", 303, tmp_path, fault_summary, proxied=True) as run:
        run.submit([run.steps(3, (0.5, 2.0)) for _ in range(30)])
        kinds = run.rng.sample(["pair cut", "site isolated, past the lease", "links slowed"] * 2,
                               6)
        while run.rounds < len(kinds) and run.live():
            time.sleep(run.rng.uniform(0.5, 2.0))
            fault = random_partition(run, kinds[run.rounds])
            with run.injecting(fault.kind, fault.sites, f"{fault.detail} for {fault.seconds:.1f}s"):
                fault.begin(run)
                time.sleep(fault.seconds)
                fault.end(run)
            run.rounds += 1
        run.notes.update(connections=sum(p.connections for p in run.links.values()),
                         connections_dropped=sum(p.dropped for p in run.links.values()))
        audit = run.finish(timeout=180)
    assert audit.problems == []
    assert run.rounds >= 4, "the jobs ended before enough faults were injected"


OUTAGE = 2 * (LEASE + MARGIN)  # the creator's site is down for this long


def current_phase(doc: Doc) -> Phase | None:
    return step_phase(doc["job"][doc["step"]]) if doc["job_status"] is None else None


def revoked_by_creator(doc: Doc, site: str) -> bool:
    return any(h["event"] == "released" and h["site"] == doc["creator"] and
               f"lease of {site} expired" in (h["detail"] or "") for h in doc["history"])


@dataclass
class Outage:
    """What reg_a saw while the creator was down."""

    waiting: list[str]  # jobs whose current step waited for the creator's decision
    started: list[str]  # jobs with a step that started during the outage
    ended: set[str]  # jobs ended by the end of the outage
    held: Doc  # the job whose winner died too, at the end of the outage
    until: str  # the end of the outage, UTC
    reg_b_down: Fault  # reg_b's daemon, killed with the creator, back after it


def creator_outage(run: Trial, held: str, shared: list[str]) -> Outage:
    """Stop the creator's site for OUTAGE seconds, and reg_b's daemon with it."""
    reg_a = run.db("reg_a")
    run.cluster.stop_site("global")
    os.kill(run.cluster.daemon_proc("reg_b").pid, signal.SIGKILL)
    down = run.fault("creator site down", "global", f"for {OUTAGE:.0f}s")
    reg_b_down = run.fault("daemon SIGKILL, down past the lease", "reg_b",
                           "until the creator is back")
    time.sleep(2.0)  # what global wrote before it went has reached reg_a by now
    waiting = [doc["_id"] for doc in reg_a.bulk_get(shared)
               if current_phase(doc) in (Phase.OPEN, Phase.CLAIMED)]
    mark = len(read_ledger(run.ledger))
    time.sleep(OUTAGE - 2.0)
    started = [row[1] for row in read_ledger(run.ledger)[mark:] if row[0] == "start"]
    docs = {doc["_id"]: doc for doc in reg_a.bulk_get(run.ids)}
    ended = {job for job, doc in docs.items() if doc["job_status"]}
    outage = Outage(waiting, started, ended, docs[held], utc_now(), reg_b_down)
    run.cluster.start_site("global")
    run.healed(down)
    return outage


def test_creator_down_longer_than_the_lease_then_back(
        tmp_path: Path, fault_summary: list[dict[str, Any]]) -> None:
    """docs/protocol.md, "What the creator's absence costs": what needs no
    arbitration goes on, claims wait, expired leases stay until the creator is back."""
    # On disk: the creator's server is stopped and started again.
    with trial("creator down", 404, tmp_path, fault_summary, in_memory=False,
               booking_timeout=3.0) as run:
        # A step running on reg_b when the creator goes; reg_b's daemon dies then
        # too, so the step's lease runs out while nobody may revoke it.
        [held] = run.submit([[new_step(ledger_command(9.0, run.ledger), target="reg_b"),
                              *run.steps(1)]])
        wait_for(lambda: run.runs() > 0, 30, "reg_b to start the held step")
        sole = run.submit([run.steps(2, (0.5, 1.0), targets=("reg_a",)) for _ in range(6)])
        # More shared jobs than the other two sites' workers and queues hold (2 free and
        # 2 held each): the creator assigns those before it goes, the rest must wait.
        shared = run.submit([run.steps(2, (0.5, 1.0), targets=("any", ["reg_a", "reg_b"]))
                             for _ in range(16)])
        wait_for(lambda: len(run.db("reg_a").bulk_get(run.ids)) == len(run.ids), 30,
                 "the jobs to reach reg_a")
        outage = creator_outage(run, held, shared)
        mark = len(read_ledger(run.ledger))
        run.rounds = 1
        wait_for(lambda: revoked_by_creator(run.db().get(held), "reg_b"), 30,
                 "the creator to revoke reg_b's expired lease")
        run.cluster.start_daemon("reg_b")
        run.healed(outage.reg_b_down)
        audit = run.finish(timeout=120)
        rerun = {row[1] for row in read_ledger(run.ledger)[mark:]} & outage.ended
        run.notes.update(
            outage_seconds=OUTAGE, jobs_ended_in_outage=len(outage.ended),
            sole_target_steps_started_in_outage=sum(job in sole for job in outage.started),
            claims_waiting=len(outage.waiting),
            claims_started_in_outage=sum(job in outage.waiting for job in outage.started),
            ended_in_outage_then_rerun=len(rerun))
    held_step = outage.held["job"][0]
    assert (held_step["step_status"], held_step["winner"]) == ("running", "reg_b")
    assert seconds_between(held_step["lease_until"], outage.until) > MARGIN  # not revoked
    assert run.notes["sole_target_steps_started_in_outage"] > 0
    assert outage.ended & set(sole), "no job with sole-target steps progressed to its end"
    assert outage.waiting and run.notes["claims_started_in_outage"] == 0
    assert not rerun, "the creator, back, undid what ended while it was away"
    assert audit.problems == []
