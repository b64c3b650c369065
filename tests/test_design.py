"""The design document: built from couch_design/, and its views on a real server."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import requests

from jobdist import client
from jobdist.core import UNSTAMPED_BAND, claim_rank
from jobdist.couch import Couch
from jobdist.couch_sync import newer_design_docs, sync_design_docs
from jobdist.design import (
    DDOC,
    DESIGN_VERSION,
    PEOPLE_DDOC,
    VERSION_FIELD,
    design_dir,
    load_design_docs,
)
from jobdist.model import new_sub_run, normalise

Doc = dict[str, Any]
# The views the daemons query on a timer (store.py, keepalive.py, schedules.py,
# retention.py): every view of their design document is indexed with them.
DAEMON_VIEWS = {"claimable", "leases", "involving", "stale_open", "waiting", "waiting_on",
                "schedules", "finished_before"}
# The views only people query (client.py, dashboard.py, analytics), or nobody yet.
PEOPLE_VIEWS = {"by_status", "by_site", "by_creator", "running", "live", "claimed_unassigned"}


def test_the_daemons_views_are_apart_from_peoples() -> None:
    [daemons, people] = load_design_docs()
    assert (design_dir() / "jobdist" / "validate_doc_update.js").is_file()
    assert (daemons["_id"], people["_id"]) == (f"_design/{DDOC}", f"_design/{PEOPLE_DDOC}")
    assert daemons["language"] == people["language"] == "javascript"
    assert set(daemons["views"]) == DAEMON_VIEWS
    assert set(daemons["filters"]) == {"jobs", "for_site"}
    assert set(people["views"]) == PEOPLE_VIEWS
    # One validator, in the daemons' design document.
    assert people.keys() == {"_id", "language", "views", "autoupdate", VERSION_FIELD}
    assert people["views"]["by_status"]["reduce"] == "_count"
    for design in (daemons, people):
        assert all(set(view) <= {"map", "reduce"} for view in design["views"].values())


def function_sources(design: Doc) -> list[str]:
    views = design["views"].values()
    return [
        *([design["validate_doc_update"]] if "validate_doc_update" in design else []),
        *(view["map"] for view in views),
        *(view["reduce"] for view in views if not view.get("reduce", "_").startswith("_")),
        *design.get("filters", {}).values(),
    ]


def every_function_source() -> list[str]:
    return [source for design in load_design_docs() for source in function_sources(design)]


def test_every_function_starts_with_function() -> None:
    # Servers evaluate "return " + source: a leading comment would return undefined.
    for source in every_function_source():
        assert source.startswith("function ("), source[:40]


ACORN = Path(__file__).resolve().parent.parent / "node_modules" / "acorn"
PARSE_ES5 = """
const acorn = require(process.argv[1]);
for (const source of JSON.parse(require("fs").readFileSync(0, "utf8"))) {
  acorn.parse("(" + source + ")", {ecmaVersion: 5});
}
"""


@pytest.mark.skipif(shutil.which("node") is None or not ACORN.is_dir(), reason="needs node, acorn")
def test_every_function_is_es5() -> None:
    # CouchDB's and pouchdb-server's engines may be old: no let, const, arrows, templates.
    sources = json.dumps(every_function_source())
    parse = subprocess.run(["node", "-e", PARSE_ES5, str(ACORN)], input=sources, text=True,
                           capture_output=True)
    assert parse.returncode == 0, parse.stderr


def test_load_design_docs_builds_from_any_tree(tmp_path: Path) -> None:
    (tmp_path / "b" / "views" / "count").mkdir(parents=True)
    (tmp_path / "b" / "views" / "count" / "map.js").write_text("function (doc) {}\n\n")
    (tmp_path / "b" / "views" / "count" / "reduce.js").write_text("_sum  \n")
    (tmp_path / "b" / "filters").mkdir()
    (tmp_path / "b" / "filters" / "all.js").write_text("function (doc, req) { return true; }\n")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "validate_doc_update.js").write_text("function (d) {}\n")
    (tmp_path / "notes.txt").write_text("not a design doc")
    assert load_design_docs(tmp_path) == [
        {"_id": "_design/a", "language": "javascript", VERSION_FIELD: DESIGN_VERSION,
         "validate_doc_update": "function (d) {}"},
        {
            "_id": "_design/b",
            "language": "javascript",
            VERSION_FIELD: DESIGN_VERSION,
            "views": {"count": {"map": "function (doc) {}", "reduce": "_sum"}},
            "filters": {"all": "function (doc, req) { return true; }"},
        },
    ]


# --- the views on a real server ---------------------------------------------------

RETRY = {"max_retries": 0}


def step(**fields: Any) -> Doc:
    return {"target": "any", "do": "true", "retry_strategy": RETRY, **fields}


def job(doc_id: str, creator: str, created_at: str, steps: list[Doc], **fields: Any) -> Doc:
    return {
        "_id": doc_id, "type": "job", "creator": creator, "priority": 0,
        "created_at": created_at, "updated_at": created_at, "step": 0, "job_status": None,
        "job": steps, "history": [], **fields,
    }


def t(minute: int) -> str:
    return f"2026-11-22T00:{minute:02d}:00.000000Z"


PROGRESS = {"fraction": 0.4, "message": "copying volume 3", "at": t(6)}
DONE = step(claimed_by="beta", winner="beta", step_status="finished", epoch=1)
JOBS = [
    # Open, for anyone.
    job("a", "alpha", t(1), [step()]),
    # Open, for two sites; kept alive after its last update.
    job("b", "alpha", t(2), [step(target=["beta", "gamma"], epoch=2)], priority=5,
        updated_at=t(3), keepalive_at=t(9)),
    # Claimed by gamma; its creator beta has not chosen a winner yet.
    job("c", "beta", t(4), [step(target="gamma", claimed_by="gamma")]),
    # Second step running at beta.
    job("d", "alpha", t(5), [DONE, step(claimed_by="beta", winner="beta", step_status="running",
                                        executioner="beta/w1", start_time=t(6), epoch=1,
                                        progress=PROGRESS)],
        step=1),
    job("e", "beta", t(7), [DONE], step=1, job_status="success"),
    job("f", "gamma", t(8), [DONE], job_status="failed"),
]


@pytest.fixture
def jobs_db(db_url: str) -> str:
    for design in load_design_docs():
        requests.put(f"{db_url}/{design['_id']}", json=design, timeout=10).raise_for_status()
    saved = requests.post(f"{db_url}/_bulk_docs", json={"docs": JOBS}, timeout=10).json()
    assert all(result.get("ok") for result in saved), saved
    return db_url


def rows(db_url: str, view: str, **params: Any) -> list[tuple[Any, Any, str | None]]:
    query = {key: json.dumps(value) for key, value in params.items()}
    ddoc = DDOC if view in DAEMON_VIEWS else PEOPLE_DDOC
    response = requests.get(f"{db_url}/_design/{ddoc}/_view/{view}", params=query, timeout=10)
    response.raise_for_status()
    return [(row["key"], row["value"], row.get("id")) for row in response.json()["rows"]]


def test_live(jobs_db: str) -> None:
    assert rows(jobs_db, "live") == [
        (["alpha", t(1)], None, "a"),
        (["alpha", t(2)], None, "b"),
        (["alpha", t(5)], None, "d"),
        (["beta", t(4)], None, "c"),
    ]


def test_claimable_has_a_row_per_target_best_first(jobs_db: str) -> None:
    # 2026-11-22T00:01:00Z is second 1795305660 of the epoch: band 179530566.
    assert rows(jobs_db, "claimable") == [
        (["any", 179530566, t(1)], {"step": 0, "epoch": 0}, "a"),
        (["beta", 179530572 - 5, t(2)], {"step": 0, "epoch": 2}, "b"),
        (["gamma", 179530572 - 5, t(2)], {"step": 0, "epoch": 2}, "b"),
    ]
    for_gamma = rows(jobs_db, "claimable", startkey=["gamma"], endkey=["gamma", {}])
    assert [row[2] for row in for_gamma] == ["b"]


def test_claimed_unassigned(jobs_db: str) -> None:
    assert rows(jobs_db, "claimed_unassigned") == [(["beta", t(4)], "gamma", "c")]


def test_stale_open_uses_the_later_of_update_and_keepalive(jobs_db: str) -> None:
    assert rows(jobs_db, "stale_open") == [
        (["alpha", t(1)], {"priority": 0, "created_at": t(1), "target": "any"}, "a"),
        (["alpha", t(9)], {"priority": 5, "created_at": t(2), "target": ["beta", "gamma"]},
         "b"),
    ]
    stale = rows(jobs_db, "stale_open", startkey=["alpha"], endkey=["alpha", t(5)])
    assert [row[2] for row in stale] == ["a"]


def test_by_status_counts(jobs_db: str) -> None:
    counts = rows(jobs_db, "by_status", reduce=True, group_level=1)
    assert counts == [(["failed"], 1, None), (["live"], 4, None), (["success"], 1, None)]
    assert rows(jobs_db, "by_status", reduce=False, key=["success", t(7)]) == [
        (["success", t(7)], None, "e")
    ]


def test_running(jobs_db: str) -> None:
    assert rows(jobs_db, "running") == [
        (["beta", t(6)], {"step": 1, "executioner": "beta/w1", "progress": PROGRESS}, "d")
    ]


def test_involving_names_each_site_once(jobs_db: str) -> None:
    involved = rows(jobs_db, "involving")
    assert sorted((key, doc_id) for key, _, doc_id in involved) == [
        ("alpha", "a"), ("alpha", "b"), ("alpha", "d"), ("beta", "c"), ("beta", "d"),
        ("gamma", "c"),
    ]


def test_jobs_filter_passes_jobs_and_deletions_only(jobs_db: str) -> None:
    rev = requests.get(f"{jobs_db}/a", timeout=10).json()["_rev"]
    requests.delete(f"{jobs_db}/a", params={"rev": rev}, timeout=10).raise_for_status()
    changes = requests.get(
        f"{jobs_db}/_changes", params={"filter": "jobdist/jobs"}, timeout=10
    ).json()["results"]
    assert sorted(change["id"] for change in changes) == ["a", "b", "c", "d", "e", "f"]
    assert [change.get("deleted") for change in changes if change["id"] == "a"] == [True]


# --- documents that leave fields out -------------------------------------------

# Run every view and filter in node on raw documents and on the same documents with
# their defaults filled in (model.normalise): a field left out must read as its default.
# Undefined values are marked, so a view that emits one is caught.
RUN_FUNCTIONS = """
var emit;
const input = JSON.parse(require("fs").readFileSync(0, "utf8"));
const out = {};
for (const [name, source] of Object.entries(input.maps)) {
  const map = eval("(" + source + ")");
  out[name] = input.docs.map(doc => { const rows = []; emit = (k, v) => rows.push([k, v]);
                                      map(doc); return rows; });
}
for (const [name, source] of Object.entries(input.filters)) {
  const filter = eval("(" + source + ")");
  out[name] = input.docs.map(doc => input.sites.map(site => filter(doc, {query: {site}})));
}
console.log(JSON.stringify(out, (key, value) => value === undefined ? "<undefined>" : value));
"""

HTTP_DOCS: list[Doc] = [{"_id": f"h{n}", **doc} for n, doc in enumerate([
    {"type": "job", "creator": "alpha", "job": [{"target": "any", "do": "make"}]},
    {"type": "job", "creator": "alpha", "job": [{"do": "make"}, {"target": ["beta"], "do": "x"}]},
    {"type": "job", "creator": "alpha", "job": [{"do": "make", "claimed_by": "beta"}],
     "priority": 3, "created_at": t(1)},
    {"type": "job", "creator": "alpha", "job": [{"do": "make", "winner": "beta",
     "claimed_by": "beta", "step_status": "running", "lease_until": t(9)}], "step": 0},
    {"type": "job", "creator": "alpha", "job": [{"do": "make"}], "job_status": "cancelled"},
    {"type": "job", "creator": "alpha", "job": [{"do": "make"}], "job_status": "success",
     "step": 1, "updated_at": t(3), "history": [{"event": "started", "step": 0,
                                                  "site": "gamma", "at": t(2)}]},
])]


def run_design_functions(docs: list[Doc], only: str | None = None) -> Any:
    """Every view and filter on `docs`, or the view `only` alone."""
    [daemons, people] = load_design_docs()
    maps = {name: view["map"] for name, view in (daemons["views"] | people["views"]).items()
            if only in (None, name)}
    payload = {"maps": maps, "filters": daemons["filters"] if only is None else {},
               "docs": docs, "sites": ["alpha", "beta", "x"]}
    node = subprocess.run(["node", "-e", RUN_FUNCTIONS], input=json.dumps(payload), text=True,
                          capture_output=True)
    assert node.returncode == 0, node.stderr
    return json.loads(node.stdout)


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_views_and_filters_read_a_missing_field_as_its_default() -> None:
    raw = run_design_functions(HTTP_DOCS)
    assert raw == run_design_functions([normalise(doc) for doc in HTTP_DOCS])
    assert "<undefined>" not in json.dumps(raw)
    assert raw["claimable"][0] == [[["any", UNSTAMPED_BAND, ""], {"step": 0, "epoch": 0}]]
    assert raw["live"][:2] == [[[["alpha", ""], None]]] * 2
    assert raw["for_site"][1] == [True, True, True]  # the first step's target: "any"


# --- the line order: the claimable view and core.claim_rank agree ----------------

RANKED = [
    (priority, created_at)
    for priority in (0, 1, -3, 7, 2.0, 10**6, "high", True, None)
    for created_at in ("2026-11-22T00:00:09.999999Z", "2026-11-22T00:00:10Z",
                       "0042-02-28T23:59:59Z", "1969-12-31T23:59:55.5Z", "2026-11-22T00:00:00",
                       None, 7)
]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_claimable_ranks_like_the_core() -> None:
    docs = [{"type": "job", "creator": "alpha", "job": [{"do": "make"}], "priority": priority,
             "created_at": created_at} for priority, created_at in RANKED]
    keys = [rows[0][0] for rows in run_design_functions(docs, "claimable")["claimable"]]
    assert [key[1] for key in keys] == [claim_rank(p, c) for p, c in RANKED]
    # Ten seconds of waiting are worth one priority level, from the creation second.
    assert claim_rank(0, "2026-11-22T00:00:10Z") == claim_rank(1, "2026-11-22T00:00:20.5Z")
    assert claim_rank(0, "2026-11-22T00:00:09.999999Z") < claim_rank(1, "2026-11-22T00:00:20Z")


# --- broadcast steps: a row per site's part ---------------------------------------

def sub_run(status: str | None, **fields: Any) -> Doc:
    return {**new_sub_run(), "status": status, **fields}


BROADCAST = {"_id": "b1", "type": "job", "creator": "alpha", "created_at": t(1), "job": [
    {"do": "snapshot", "target": "all", "step_status": "running", "start_time": t(1),
     "runs": {"alpha": sub_run("finished", epoch=1), "beta": sub_run(
         "running", epoch=2, lease_until=t(9), start_time=t(2), executioner="beta/w1"),
              "gamma": sub_run(None), "x": sub_run(None)},
     "dropped": ["x"]},
    {"do": "verify", "target": "alpha"}]}
UNOPENED = {"_id": "b2", "type": "job", "creator": "alpha", "created_at": t(1),
            "job": [{"do": "snapshot", "target": ["beta", "gamma"], "each": True}]}


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_views_give_each_sites_part_of_a_broadcast_a_row() -> None:
    raw = run_design_functions([BROADCAST, UNOPENED])
    rank = claim_rank(0, t(1))
    assert raw["claimable"] == [[[["gamma", rank, t(1)], {"step": 0, "epoch": 0}]], []]
    assert raw["leases"][0] == [[["alpha", t(9)], {"step": 0, "winner": "beta"}]]
    assert raw["running"][0] == [[["beta", t(2)], {"step": 0, "executioner": "beta/w1",
                                                   "progress": None}]]
    assert sorted(key for key, _ in raw["involving"][0]) == ["alpha", "beta", "gamma", "x"]
    assert sorted(key[0] for key, _ in raw["by_site"][0]) == ["alpha", "beta", "gamma", "x"]
    assert raw["by_creator"][0][0][1]["fan_out"] == "1/3"
    assert raw["by_creator"][0][0][1] == client.summary_of(normalise(BROADCAST)) | {
        "priority": 0, "step": 0}
    assert raw["for_site"][0] == [True, True, True]  # "all" runs at every site
    assert raw["stale_open"][1] != []  # the creator opens it: its keep-alive finds it


def test_people_views_are_not_kept_warm_by_couchdbs_background_indexer() -> None:
    daemons, people = load_design_docs()
    assert people["_id"] == "_design/jobdist_people" and people["autoupdate"] is False
    assert "autoupdate" not in daemons  # the daemons' views: indexed as CouchDB sees fit


# The design documents' digest at each DESIGN_VERSION. A change under couch_design/
# fails this until DESIGN_VERSION is raised and its digest recorded here: an older
# release's setup must be able to tell that it would downgrade them.
DIGESTS = {1: "f950f17e55e4d5fa0f2a49cb2aecc88a012558ef7dda7a56be51391849b1663c",
           2: "8511dab13ba4793cf5dd778dc21f87ea4fdc68b4e7f8015fa0c5f1221635e6ea",
           3: "a899582085bea5091af0e883a70afcb3571914a8001c6424ada347cd35810f58"}


def test_the_design_version_is_raised_with_every_change_to_the_design_documents() -> None:
    docs = load_design_docs()
    assert {doc[VERSION_FIELD] for doc in docs} == {DESIGN_VERSION}
    content = [{k: v for k, v in doc.items() if k != VERSION_FIELD} for doc in docs]
    digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
    assert DIGESTS.get(DESIGN_VERSION) == digest, (
        f"couch_design/ changed: raise DESIGN_VERSION and record {digest} for it")


def test_setup_never_downgrades_design_documents_of_a_newer_version(db_url: str) -> None:
    """A site upgraded first keeps its design documents when an older release's setup
    (or daemon) runs there; a site behind is brought up to ours."""
    db = Couch(db_url.rpartition("/")[0]).database(db_url.rpartition("/")[2])
    ours = load_design_docs()
    newer = {**ours[0], VERSION_FIELD: DESIGN_VERSION + 1, "views": {}}
    older = {k: v for k, v in ours[1].items() if k != VERSION_FIELD} | {"views": {}}
    for doc in (newer, older):
        requests.put(f"{db_url}/{doc['_id']}", json=doc, timeout=10).raise_for_status()
    assert newer_design_docs(db, ours) == {ours[0]["_id"]: DESIGN_VERSION + 1}
    assert sync_design_docs(db, ours) == [ours[1]["_id"]]
    assert db.get(ours[0]["_id"])["views"] == {}
    assert db.get(ours[1]["_id"])[VERSION_FIELD] == DESIGN_VERSION
