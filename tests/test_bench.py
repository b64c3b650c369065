"""`jobdist bench`: each subcommand at a tiny size on real local sites, and its helpers.

No timed assertions: the machine is shared, so only the shape of the output
and the arithmetic between its parts are checked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import click
import pytest
import requests
from click.testing import CliRunner

import jobdist.lab.bench.throughput as throughput_module
from jobdist.couch import Couch
from jobdist.lab.bench.common import Request, bench, parse_requests, percentile, request_kind
from jobdist.lab.bench.memory import Memory
from jobdist.lab.bench.replication import ReplicationRow, parse_site_range, replication_table
from jobdist.lab.bench.revisions import revision_trees
from jobdist.lab.bench.targets import (
    burst_targets,
    busy_targets,
    latency_targets,
    many_sites_targets,
    memory_target,
    tally,
    targets_table,
)
from jobdist.lab.bench.throughput import (
    RawRates,
    Throughput,
    busy_shares,
    census_table,
    scheduling_overheads,
    throughput_table,
)
from jobdist.setup import admin_couch_of

LOG_SAMPLE = """\
[Sun, 22 Nov 2026 01:11:42 GMT] [info] [<0.000.0>] 127.0.0.1 - - PUT /_config/log/level 200
[Sun, 22 Nov 2026 01:11:42 GMT] [debug] [<0.000.0>] 'POST' /jobs/_bulk_docs {1,1} from "127.0.0.1"
Headers: [{'Accept', application/json},
          {'Content-Length', 717},
          {'User-Agent', node-fetch/1.0 (+https://github.com/bitinn/node-fetch)}
[Sun, 22 Nov 2026 01:11:42 GMT] [info] [<0.000.0>] 127.0.0.1 - - POST /jobs/_bulk_docs 201
[Sun, 22 Nov 2026 01:11:42 GMT] [debug] [<0.000.0>] 'GET' /jobs/j1?open_revs=all {1,1} from "::1"
Headers: [{'Accept', */*},
          {'User-Agent', python-requests/2.34.2}
"""


def run_json(*args: str) -> Any:
    result = CliRunner().invoke(bench, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def rendered(table: Any) -> str:
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


# --- helpers -------------------------------------------------------------------------------


def test_percentile_is_a_measured_value() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0], 99) == 3.0


def test_site_range() -> None:
    assert parse_site_range("2..5") == [2, 3, 4, 5]
    assert parse_site_range("3") == [3]
    assert parse_site_range("2,4") == [2, 4]
    for bad in ("1..3", "x", ""):
        with pytest.raises(click.BadParameter):
            parse_site_range(bad)


def test_server_log_entries_and_kinds() -> None:
    found = parse_requests(LOG_SAMPLE)
    assert found == [
        Request("POST", "/jobs/_bulk_docs", "node-fetch/1.0 (+https://github.com/bitinn/node-fetch)",
                717),
        Request("GET", "/jobs/j1?open_revs=all", "python-requests/2.34.2", 0),
    ]
    assert [request_kind(r) for r in found] == [
        "replicator POST /jobs/_bulk_docs", "jobdist GET /jobs/{doc} open_revs"]
    assert request_kind(Request("PUT", "/jobs/_local/abc%3D", "node-fetch/1.0", 9)) == (
        "replicator PUT /jobs/_local/{local}")


def test_scheduling_overhead_counts_from_runnable_and_free() -> None:
    def job(created: str, start: str, finish: str, worker: str) -> dict[str, Any]:
        step = {"start_time": start, "finish_time": finish, "winner": "a",
                "executioner": worker}
        return {"created_at": created, "job": [step]}

    t = "2026-01-01T00:00:0{}.000000Z".format
    docs = [job(t(0), t(1), t(3), "a/w0"),  # worker free since 0: waited 1 s
            job(t(0), t(4), t(5), "a/w0")]  # worker busy until 3: waited 1 s after that
    assert scheduling_overheads(docs, since=t(0)) == [1.0, 1.0]


def test_tables_render() -> None:
    row = ReplicationRow("mesh", 3, 4, 3, 9.0, 0.5, 18.0, 40.0, 12.5, 2.0)
    assert row.replicated_per_step == 6.0 and row.thesis_per_step == 16
    assert "0.38" in rendered(replication_table("mesh", [row]))
    spread = {"p50": 0.1, "p95": 0.2, "p99": 0.3, "max": 0.4}
    result = throughput(spread)
    assert result.steps_per_s == 5.0 and result.writes_per_s == 20.0
    shown = rendered(throughput_table(result))
    assert "100/200/300 ms" in shown and "100.0 / 50.0" in shown and "a 50%, b 100%" in shown
    assert "0.50" in rendered(census_table(result.requests, 10))


def throughput(spread: dict[str, float], command: str = "true") -> Throughput:
    return Throughput(10, command, 2, 2, 2.0, 1.5, spread, spread, spread,
                      {"a": 0.5, "b": 1.0}, 3.0, 1, RawRates(50, 200.0, 2000.0),
                      {"server": 1.0, "daemon": 0.5, "wall": 2.0}, 10, {"replicator GET /": 5},
                      "global", "first", "star", 40, 3, 0.25)


def test_busy_shares_count_worker_time_while_work_waited() -> None:
    t = "2026-01-01T00:00:0{}.000000Z".format

    def job(site: str, start: int, finish: int) -> dict[str, Any]:
        return {"job": [{"winner": site, "start_time": t(start), "finish_time": t(finish)}]}

    # Work waited from 0 (first start) to 4 (last start); 2 workers a site.
    docs = [job("a", 0, 2), job("a", 0, 4), job("a", 2, 6), job("b", 4, 5)]
    assert busy_shares(docs, workers=2) == {"a": (2 + 4 + 2) / 8, "b": 0.0}


def test_targets_say_met_or_missed_with_the_figure() -> None:
    fast = {"p50": 0.1, "p95": 0.2, "p99": 0.3, "max": 0.4}
    slow = {"p50": 0.3, "p95": 0.6, "p99": 0.7, "max": 0.8}
    assert [t.met for t in latency_targets(throughput(fast))] == [True, True]
    missed = latency_targets(throughput(slow))
    assert [t.met for t in missed] == [False, False] and missed[0].figure == "300 ms"
    # 10 steps in 2 s, 5 requests for 10 steps, 50 ms of daemon CPU a step.
    burst = burst_targets(throughput(fast), throughput(fast))
    assert [t.met for t in burst] == [False, True, False, None]  # the last: reported only
    assert burst[0].figure.startswith("5.0 steps/s") and burst[1].figure == "0.5"
    busy = busy_targets(throughput(fast, "sleep 0.5"))
    assert [t.met for t in busy] == [False, False] and busy[0].figure == "a 50%, b 100%"
    assert memory_target(Memory(100, 1.0, 1.0, 100.0, 140.0)).met  # 146.8 MB
    memory = memory_target(Memory(100, 1.0, 1.0, 100.0, 145.0))
    assert not memory.met and memory.figure.startswith("152.0 MB")
    assert "no" in rendered(targets_table([*burst, memory]))
    assert tally([*burst, memory]) == "1 of 4 targets met (1 reported only)"
    assert tally(latency_targets(throughput(fast))) == "2 of 2 targets met"


def test_many_sites_targets_hold_throughput_and_revisions_to_three_sites() -> None:
    spread = {"p50": 0.1, "p95": 0.2, "p99": 0.3, "max": 0.4}
    three = throughput(spread)  # 5 steps/s, 3 revisions a step
    runs = {3: three,
            6: dataclasses.replace(three, wall=4.0, revisions_per_step=3.2),  # 1/2, +7 %
            9: dataclasses.replace(three, wall=6.1, revisions_per_step=3.4)}  # < 1/3, +13 %
    targets = many_sites_targets(runs)
    assert [t.met for t in targets] == [True, True, False, False]
    assert targets[0].figure.startswith("0.500 (2.5 against 5.0; 4.0 against 4.0 documents")
    assert targets[3].figure.startswith("+13% (3.40 against 3.00; with no conflict 1.25")
    assert targets[0].what.startswith("6 sites against 3 (star, 10 `true` jobs, 2 workers")


# --- the subcommands on real local sites -------------------------------------------------------


@pytest.mark.e2e
def test_bench_is_a_jobdist_command() -> None:
    from jobdist.cli import main

    result = CliRunner().invoke(main, ["bench", "--help"])
    assert result.exit_code == 0
    for command in ("thesis", "throughput", "replication", "memory", "priorities"):
        assert command in result.output


@pytest.mark.e2e
def test_thesis_scenario_one() -> None:
    out = run_json("--in-memory", "thesis", "--step-seconds", "0.1", "--only", "1:")
    assert out["step_seconds"] == 0.1
    assert out["servers"] == "pouchdb-server in memory"
    [row] = out["scenarios"]
    assert row["scenario"].startswith("1:") and row["problems"] == []
    assert row["jobs_ok"] == row["jobs"] == 1
    assert row["makespan"] >= row["ideal"] == pytest.approx(0.3)
    assert row["ratio_ideal"] == pytest.approx(row["makespan"] / row["ideal"])
    assert row["ratio_thesis"] == pytest.approx(row["makespan"] / row["thesis_optimum"])
    assert 1 <= row["revisions_min"] <= row["revisions_max"]
    assert row["revisions_per_step_max"] == pytest.approx((row["revisions_max"] - 1) / 3)


@pytest.mark.e2e
def test_throughput_small() -> None:
    out = run_json("throughput", "--jobs", "20", "--sites", "2", "--workers", "2",
                   "--raw-writes", "50")
    assert out["jobs_ok"] == out["jobs"] == 20
    assert out["servers"] == "pouchdb-server on disk"  # as users run them, unless asked
    assert out["steps_per_s"] == pytest.approx(20 / out["wall"])
    assert 0 < out["latency"]["p50"] <= out["latency"]["p95"] <= out["latency"]["p99"]
    assert 0 <= out["overhead"]["p50"] <= out["overhead"]["p99"]
    # A step is at least one revision (a short one's start is written with its end).
    assert out["revisions_per_step"] >= 1
    assert out["raw"]["single_put_per_s"] > 0 and out["raw"]["bulk_docs_per_s"] > 0
    assert out["writes_per_s_vs_single_put"] == pytest.approx(
        out["writes_per_s"] / out["raw"]["single_put_per_s"])
    assert out["cpu"]["server"] > 0


@pytest.mark.e2e
def test_throughput_submitted_at_every_site_spreads_the_creators(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`--submit-at every`: each site creates its share at its own server, and a step
    counts as run away from its own creator, not from the first site."""
    shares: dict[str, int] = {}
    submit = throughput_module.submit_all

    def counted(db: Any, creator: str, steps: Any, count: int) -> list[str]:
        shares[creator] = count
        return submit(db, creator, steps, count)

    monkeypatch.setattr(throughput_module, "submit_all", counted)
    out = run_json("--in-memory", "throughput", "--jobs", "7", "--sites", "3", "--workers",
                   "1", "--raw-writes", "10", "--submit-at", "every")
    assert shares == {"global": 3, "reg_a": 2, "reg_b": 2}
    assert out["submit_at"] == "every" and out["jobs_ok"] == 7
    assert out["revisions_floor"] == pytest.approx(1 + out["remote_share"])
    assert 0 <= out["remote_share"] <= 1


@pytest.mark.e2e
def test_throughput_runs_in_the_topology_asked_and_counts_what_replication_did(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`--topology star` reaches the sites: the hub pushes filtered, the spokes to it."""
    seen: dict[str, set[str]] = {}
    cluster_of = throughput_module.local_cluster

    @contextlib.contextmanager
    def spied(*args: Any) -> Iterator[Any]:
        with cluster_of(*args) as cluster:
            for name, site in cluster.sites.items():
                rows = admin_couch_of(site).database("_replicator").all_docs()
                seen[name] = {row["id"] for row in rows if row["id"].startswith("jobdist-")}
            yield cluster

    monkeypatch.setattr(throughput_module, "local_cluster", spied)
    out = run_json("--in-memory", "throughput", "--jobs", "10", "--sites", "3", "--workers",
                   "1", "--raw-writes", "10", "--topology", "star", "--requests")
    # One server a site, each with its own `_replicator`: the star's four links.
    assert seen == {"global": {"jobdist-global-to-reg_a", "jobdist-global-to-reg_b"},
                    "reg_a": {"jobdist-reg_a-to-global"}, "reg_b": {"jobdist-reg_b-to-global"}}
    assert out["topology"] == "star" and out["jobs_ok"] == 10
    # Every revision reaches the two other sites, each at most once (as history only
    # when superseded before the replicator reads it); status documents add theirs.
    revisions = out["jobs"] * (1 + out["revisions_per_step"])
    assert out["jobs"] * 2 <= out["replicated"] <= 2 * (revisions + out["status_revisions"])
    assert out["replicated_per_step"] == pytest.approx(out["replicated"] / 10)
    assert out["replication_requests_per_step"] == pytest.approx(sum(
        count for kind, count in out["requests"].items() if kind.startswith("replicator ")) / 10)
    assert out["replication_requests_per_step"] > 0


@pytest.mark.e2e
def test_replication_mesh_two_and_three_sites() -> None:
    out = run_json("replication", "--sites", "2..3", "--topology", "mesh", "--jobs", "4",
                   "--step-seconds", "0.05")
    rows = out["mesh"]
    assert [row["sites"] for row in rows] == [2, 3]
    for row in rows:
        # The creation, then each end (a start chained onto the end before, the first
        # written with its end when the step is short).
        assert row["revisions_per_job"] >= 1 + 3
        # Every other site gets at least the final revision, at most every revision
        # (ones superseded before the replicator reads them travel as history only).
        others = row["sites"] - 1
        assert others <= row["replicated_per_job"] <= others * row["revisions_per_job"]
        assert row["thesis_per_step"] == 4 * (row["sites"] - 1) ** 2
        assert row["replication_requests_per_job"] > 0


@pytest.mark.e2e
def test_memory_small() -> None:
    out = run_json("memory", "--jobs", "200", "--timeout", "60")
    assert out["jobs"] == 200
    assert 0 < out["rss_mib"] <= out["peak_mib"]


@pytest.mark.e2e
def test_priorities_small() -> None:
    out = run_json("priorities", "--sites", "2", "--rate", "4", "--duration", "4",
                   "--step-seconds", "0.2", "--low", "2", "--high-priority", "1")
    assert len(out["low_waits"]) == 2 and out["high_jobs"] >= 12
    assert all(wait >= 0 for wait in out["low_waits"])
    assert out["low"]["max"] == max(out["low_waits"])
    assert out["bound"] == pytest.approx(2 * 10 + out["high_waits"]["max"])
    assert 0 <= out["low_done_during_stream"] <= 2


@pytest.mark.parametrize("batch", [1, 500])
def test_revision_trees_name_every_revision_and_leaf_of_the_documents_asked(
        db_url: str, batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("jobdist.lab.bench.revisions.REVISIONS_BATCH", batch)  # one leaf a request
    base, name = db_url.rsplit("/", 1)
    db = Couch(base).database(name)
    db.bulk_docs([{"_id": "a", "n": 1}, {"_id": "b"}, {"_id": "other"}])
    first = db.get("a")["_rev"]
    requests.put(f"{db_url}/a", json={**db.get("a"), "n": 2}, timeout=10).raise_for_status()
    # Two more branches from revision 1, as replication would bring them, one of them
    # deleted: three leaves, four revisions.
    for branch, deleted in (("beef", False), ("dead", True)):
        leaf = {"_id": "a", "_rev": f"2-{branch}", "_deleted": deleted,
                "_revisions": {"start": 2, "ids": [branch, first.split("-")[1]]}}
        requests.post(f"{db_url}/_bulk_docs", json={"docs": [leaf], "new_edits": False},
                      timeout=10).raise_for_status()

    trees = revision_trees(db, ["a", "b", "missing"])

    assert set(trees) == {"a", "b"}
    revs, leaves = trees["a"]
    assert leaves == 3 and first in revs and {"2-beef", "2-dead"} < revs and len(revs) == 4
    assert trees["b"][1] == 1 and trees["b"][0] == {db.get("b")["_rev"]}
