"""Automatic creator succession (docs/protocol.md, "Automatic succession"): a creator
killed for good, a creator cut off and healed, a successor that dies too. No operator
acts: every job ends, no step is counted twice, and every run that did not count is
explained by the history (the audit names the takeover that caused it)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from jobdist.lab.faults import Trial, trial
from jobdist.model import Doc

from ..helpers import wait_for

pytestmark = pytest.mark.faults

CREATOR_TIMEOUT = 6.0  # the shortest the config allows is 4 s: four status renewals
LINE = {"global": ["reg_a", "reg_b"]}
# Steps that a site of the line other than the creator can run when it is gone.
TARGETS: tuple[str | list[str], ...] = ("any", "any", "reg_a", "reg_b", ["reg_a", "reg_b"],
                                        ["global", "reg_b"])
REG_B_TARGETS: tuple[str | list[str], ...] = ("any", "reg_b", ["reg_a", "reg_b"],
                                              ["global", "reg_b"])


def succession_trial(name: str, seed: int, tmp_path: Path, summary: list[dict[str, Any]],
                     **options: Any) -> Any:
    return trial(name, seed, tmp_path, summary, successors=LINE,
                 creator_timeout=CREATOR_TIMEOUT, booking_timeout=3.0, **options)


def taken_over(run: Trial, site: str, by: str) -> list[str]:
    """The jobs `site` sees adopted by `by`."""
    return [doc["_id"] for doc in run.db(site).bulk_get(run.ids)
            if any(h["event"] == "adopted" and h["site"] == by for h in doc["history"])]


def takeovers(run: Trial) -> list[Doc]:
    return run.events("adopted", "automatic succession")


def note_takeovers(run: Trial) -> None:
    run.notes.update(
        jobs_taken_over=sum(any(h["event"] == "adopted" for h in doc["history"])
                            for doc in run.docs.values()),
        takeovers=dict(Counter(f"{e['site']} term {e['epoch']}" for e in takeovers(run))))


def kill_creator_mid_run(run: Trial, runs: int) -> None:
    """Once `runs` steps have started, global is killed for good (SIGKILL, server gone)."""
    wait_for(lambda: run.runs() >= runs, 30, "some steps to run")
    run.kill_site("global")
    run.fault("creator killed for good", "global", f"creator_timeout {CREATOR_TIMEOUT:g} s")


def test_a_creator_killed_for_good_is_succeeded_and_every_job_ends(
        tmp_path: Path, fault_summary: list[dict[str, Any]]) -> None:
    with succession_trial("creator killed for good", 505, tmp_path, fault_summary) as run:
        run.submit([run.steps(3, (0.3, 1.0), targets=TARGETS) for _ in range(12)])
        kill_creator_mid_run(run, runs=6)
        run.rounds = 1
        audit = run.finish(timeout=90)
        note_takeovers(run)
    assert audit.problems == []
    assert takeovers(run), "nobody took the creator's jobs over"
    assert {e["site"] for e in takeovers(run)} == {"reg_a"}  # the first successor alone
    assert all(doc["creator"] in ("global", "reg_a") for doc in run.docs.values())


def test_a_creator_cut_off_and_healed_never_counts_a_step_twice(
        tmp_path: Path, fault_summary: list[dict[str, Any]]) -> None:
    """Both sides arbitrate while cut off: the duplicates are fenced and explained."""
    with succession_trial("creator cut off, healed", 606, tmp_path, fault_summary,
                          proxied=True) as run:
        run.submit([run.steps(3, (0.5, 1.5), targets=TARGETS) for _ in range(12)])
        wait_for(lambda: run.runs() >= 4, 30, "some steps to run")
        cut, cut_at = [link for link in run.links if "global" in link], time.monotonic()
        for link in cut:
            run.links[link].cut()
        seconds = 3 * CREATOR_TIMEOUT
        cut_off = run.fault("creator cut off", "global", f"for {seconds:g} s, creator_timeout "
                            f"{CREATOR_TIMEOUT:g} s")
        wait_for(lambda: taken_over(run, "reg_a", "reg_a"), seconds,
                 "reg_a to take jobs over while global is cut off")
        time.sleep(max(0.0, cut_at + seconds - time.monotonic()))
        for link in cut:
            run.links[link].restore()
        run.healed(cut_off)
        run.rounds = 1
        audit = run.finish(timeout=120)
        note_takeovers(run)
        run.notes["duplicates_after_takeover"] = sum("taken over" in d or "two creators" in d
                                                     for d in audit.duplicates)
    assert audit.problems == []
    assert takeovers(run)


def test_a_successor_that_dies_too_is_succeeded_by_the_next(
        tmp_path: Path, fault_summary: list[dict[str, Any]]) -> None:
    with succession_trial("successor dies too", 707, tmp_path, fault_summary) as run:
        run.submit([run.steps(3, (0.5, 1.5), targets=REG_B_TARGETS) for _ in range(10)])
        kill_creator_mid_run(run, runs=4)
        wait_for(lambda: taken_over(run, "reg_b", "reg_a"), 4 * CREATOR_TIMEOUT,
                 "reg_a's takeover to reach reg_b")
        run.kill_site("reg_a")
        run.fault("successor killed for good", "reg_a", "just after it took over")
        run.rounds = 2
        audit = run.finish(timeout=120)
        note_takeovers(run)
    assert audit.problems == []
    assert "reg_b" in {e["site"] for e in takeovers(run)}
