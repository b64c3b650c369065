"""jobdist.couch against a real pouchdb-server (the session server of conftest.py)."""

from __future__ import annotations

import copy
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from jobdist.couch import (
    Conflict,
    Couch,
    CouchError,
    Database,
    Forbidden,
    NotFound,
    Rejected,
    Saved,
    Unavailable,
)
from jobdist.couch_changes import Change, changes, continuous_items, eventsource_items
from jobdist.couch_sync import put_replication, sync_design_docs
from jobdist.couch_views import iter_view
from jobdist.lab.localserver import LocalServer, free_port

from .helpers import wait_for

VALIDATOR = {
    "_id": "_design/rules",
    "validate_doc_update": (
        "function (newDoc) { if (newDoc.forbidden_field) "
        "{ throw({forbidden: 'forbidden_field is not allowed'}); } }"
    ),
}
BY_GROUP = {
    "_id": "_design/q",
    "views": {
        "by_group": {"map": "function (doc) { if (doc.n !== undefined) emit(doc.g, doc.n); }"}
    },
    "filters": {"odd": "function (doc) { return doc.n % 2 === 1; }"},
}


@pytest.fixture
def couch(couch_server: LocalServer) -> Couch:
    return Couch(couch_server.url, retries=2)


@pytest.fixture
def db(couch: Couch, db_url: str) -> Database:
    return couch.database(db_url.rsplit("/", 1)[1])


@pytest.fixture
def other_db(couch: Couch) -> Iterator[Database]:
    """A second database on the same server, for replication."""
    database = couch.ensure_database(f"t_{uuid.uuid4().hex[:12]}")
    yield database
    requests.delete(database.url, timeout=10)


def make_conflict(db: Database, doc_id: str) -> tuple[str, str]:
    """Two live leaves of one document, as replication between two writers makes them."""
    first = db.save({"_id": doc_id, "v": "a"})
    assert isinstance(first, Saved)
    body = {"new_edits": False, "docs": [{"_id": doc_id, "v": "b", "_rev": "1-ffff"}]}
    requests.post(f"{db.url}/_bulk_docs", json=body, timeout=10).raise_for_status()
    return first.rev, "1-ffff"


def test_server_identity(couch: Couch) -> None:
    assert "express-pouchdb" in couch.info()
    assert couch.is_apache_couchdb() is False


def test_save_get_and_conflict(db: Database) -> None:
    assert db.exists() and db.get("job-1") is None
    first = db.save({"_id": "job-1", "step": 0})
    assert isinstance(first, Saved) and first.id == "job-1"
    assert db.get("job-1") == {"_id": "job-1", "_rev": first.rev, "step": 0}
    # Writing without (or with a stale) _rev never overwrites.
    assert db.save({"_id": "job-1", "step": 9}) == Conflict("job-1")
    second = db.save({"_id": "job-1", "_rev": first.rev, "step": 1})
    assert isinstance(second, Saved)
    assert db.save({"_id": "job-1", "_rev": first.rev, "step": 2}) == Conflict("job-1")
    assert db.get("job-1", rev=first.rev)["step"] == 0
    assert db.delete("job-1", first.rev) == Conflict("job-1")
    assert isinstance(db.delete("job-1", second.rev), Saved)
    assert db.get("job-1") is None and db.leaves("job-1") == []


def test_awkward_ids_are_quoted(db: Database) -> None:
    for doc_id in ("a/b", "sp ace?x=1&y#z", "_design/x", "_local/y", "100%"):
        assert isinstance(db.save({"_id": doc_id, "v": 1}), Saved), doc_id
        assert db.get(doc_id)["_id"] == doc_id
    assert {row["id"] for row in db.all_docs()} == {"a/b", "sp ace?x=1&y#z", "_design/x", "100%"}


def test_missing_database_raises(couch: Couch) -> None:
    missing = couch.database("no_such_db_" + uuid.uuid4().hex[:8])
    assert missing.exists() is False
    with pytest.raises(NotFound, match="no_such_db_"):
        missing.get("x")
    with pytest.raises(NotFound):
        missing.save({"_id": "x"})


def test_leaves_and_conflicts(db: Database) -> None:
    rev_a, rev_b = make_conflict(db, "job-c")
    leaves = db.leaves("job-c")
    assert sorted(leaf["_rev"] for leaf in leaves) == sorted([rev_a, rev_b])
    winner = db.get("job-c", conflicts=True)
    assert winner["_rev"] in (rev_a, rev_b)
    assert winner["_conflicts"] == [rev_b if winner["_rev"] == rev_a else rev_a]
    assert "_conflicts" not in db.get("job-c")
    # A deleted leaf is no longer live.
    loser = winner["_conflicts"][0]
    assert isinstance(db.delete("job-c", loser), Saved)
    assert [leaf["_rev"] for leaf in db.leaves("job-c")] == [winner["_rev"]]
    assert "_conflicts" not in db.get("job-c", conflicts=True)


def test_bulk_docs_mixed_results_in_input_order(db: Database) -> None:
    assert sync_design_docs(db, [VALIDATOR]) == ["_design/rules"]
    old = db.save({"_id": "old", "v": 0})
    assert isinstance(old, Saved)
    docs = [
        {"_id": "new-1", "v": 1},
        {"_id": "bad", "forbidden_field": True},
        {"_id": "old", "v": 1},  # no _rev: conflict
        {"v": "no id"},
        {"_id": "old-2", "v": 2},
    ]
    results = db.bulk_docs(docs)
    assert [type(r) for r in results] == [Saved, Rejected, Conflict, Saved, Saved]
    assert [r.id for r in results][:3] == ["new-1", "bad", "old"]
    assert results[1] == Rejected("bad", "forbidden", "forbidden_field is not allowed")
    assert db.get(results[3].id)["v"] == "no id"
    assert "_id" not in docs[3]  # the caller's document is left alone
    assert db.bulk_docs([]) == []


def test_save_refused_by_validator_raises_forbidden(db: Database) -> None:
    sync_design_docs(db, [VALIDATOR])
    with pytest.raises(Forbidden) as caught:
        db.save({"_id": "bad", "forbidden_field": 1})
    assert caught.value.reason == "forbidden_field is not allowed"
    assert "'bad'" in str(caught.value) and db.name in str(caught.value)


def test_bulk_get(db: Database) -> None:
    make_conflict(db, "c")
    db.bulk_docs([{"_id": "a", "v": 1}, {"_id": "b", "v": 2}])
    gone = db.save({"_id": "gone"})
    db.delete("gone", gone.rev)
    docs = db.bulk_get(["b", "missing", "gone", "a", "c"])
    assert [d["_id"] for d in docs] == ["b", "a", "c"]
    assert "_conflicts" not in docs[2]
    assert len(db.bulk_get(["c"], conflicts=True)[0]["_conflicts"]) == 1
    assert db.bulk_get([]) == []


def test_view_and_paging_with_duplicate_keys(db: Database) -> None:
    sync_design_docs(db, [BY_GROUP])
    # 25 rows over keys 0, 1, 2: key 0 has 10 rows, more than a page.
    db.bulk_docs([{"_id": f"d{n:02d}", "g": n // 10, "n": n} for n in range(25)])
    rows = db.view("q", "by_group")
    assert [(r["key"], r["id"]) for r in rows] == [(n // 10, f"d{n:02d}") for n in range(25)]
    assert [r["value"] for r in db.view("q", "by_group", key=1)] == list(range(10, 20))
    assert len(db.view("_design/q", "by_group", keys=[2, 0])) == 15
    assert [r["id"] for r in db.view("q", "by_group", startkey=2, include_docs=True)] == [
        f"d{n}" for n in range(20, 25)
    ]

    def paged(**params: Any) -> list[str]:
        return [r["id"] for r in iter_view(db, "q", "by_group", page_size=7, **params)]

    assert paged() == [r["id"] for r in rows]
    assert paged(descending=True) == [r["id"] for r in reversed(rows)]
    assert paged(key=0) == [f"d{n:02d}" for n in range(10)]
    assert paged(startkey=1, endkey=1, limit=8) == [f"d{n}" for n in range(10, 18)]
    assert paged(startkey=3) == []
    assert [r["id"] for r in iter_view(db, "q", "by_group", page_size=1)] == paged()
    with pytest.raises(ValueError):
        next(iter_view(db, "q", "by_group", skip=3))


def test_view_cleanup_after_a_view_changed_keeps_the_new_index(db: Database) -> None:
    """setup cleans up after rewriting a design document: the old view's index goes,
    the new one still answers, and a missing database is a clear NotFound."""
    sync_design_docs(db, [BY_GROUP])
    db.save({"_id": "a", "g": 1, "n": 5})
    assert [r["key"] for r in db.view("q", "by_group")] == [1]
    by_n = copy.deepcopy(BY_GROUP)
    by_n["views"]["by_group"]["map"] = "function (doc) { emit(doc.n, null); }"
    assert sync_design_docs(db, [by_n]) == ["_design/q"]
    db.view_cleanup()
    assert [r["key"] for r in db.view("q", "by_group")] == [5]
    with pytest.raises(NotFound):
        db.couch.database("no_such_db").view_cleanup()


def test_a_lazy_view_query_answers_from_the_index_as_it_stands(db: Database) -> None:
    """`update=lazy` (CouchDB 3; the embedded server by our patch): the rows as indexed,
    the index brought up to date afterwards, never while the caller waits."""
    sync_design_docs(db, [BY_GROUP])
    db.save({"_id": "before", "g": 0, "n": 1})
    assert [r["id"] for r in db.view("q", "by_group")] == ["before"]  # indexed
    db.save({"_id": "after", "g": 0, "n": 2})
    lazy = [r["id"] for r in db.view("q", "by_group", update="lazy")]
    assert "before" in lazy
    if not db.couch.is_apache_couchdb():  # CouchDB may have indexed it meanwhile
        assert lazy == ["before"]
    assert [r["id"] for r in db.view("q", "by_group")] == ["after", "before"]


def test_answers_come_uncompressed(db: Database) -> None:
    """We ask for no gzip (the server is the site's own): even a large answer is plain."""
    db.bulk_docs([{"_id": f"d{n:03d}", "text": "x" * 100} for n in range(50)])
    answer = db.couch.client.post_all_docs(db=db.name, include_docs=True)
    assert len(answer.get_result()["rows"]) == 50
    assert "content-encoding" not in {name.lower() for name in answer.get_headers()}


def test_request_bodies_go_uncompressed(db: Database) -> None:
    """The SDK gzips request bodies unless told not to; the server would inflate each."""
    encodings: list[str | None] = []
    session = db.couch.client.get_http_client()
    hook = lambda response, *args, **kwargs: encodings.append(  # noqa: E731
        response.request.headers.get("Content-Encoding"))
    session.hooks["response"].append(hook)
    try:
        db.bulk_docs([{"_id": f"e{n:03d}", "text": "x" * 100} for n in range(50)])
    finally:
        session.hooks["response"].remove(hook)
    assert encodings == [None]


def test_view_errors(db: Database) -> None:
    with pytest.raises(NotFound):
        db.view("nope", "nope")


def test_changes_normal_since(db: Database) -> None:
    start = db.last_seq()
    db.save({"_id": "a"})
    db.save({"_id": "b", "n": 1})
    batch = list(changes(db, start, feed="normal", include_docs=True))
    assert [c.id for c in batch] == ["a", "b"]
    assert batch[1].doc["n"] == 1 and not batch[1].deleted and len(batch[1].revs) == 1
    # A seq from a change is handed back verbatim and yields only what came after it.
    db.save({"_id": "c"})
    assert [c.id for c in changes(db, batch[-1].seq, feed="normal")] == ["c"]
    assert list(changes(db, db.last_seq(), feed="normal")) == []


def test_changes_filter_and_all_revs(db: Database) -> None:
    sync_design_docs(db, [BY_GROUP])
    start = db.last_seq()
    db.bulk_docs([{"_id": f"n{n}", "n": n} for n in range(4)])
    assert [c.id for c in changes(db, start, feed="normal", filter="q/odd")] == ["n1", "n3"]
    make_conflict(db, "x")
    (change,) = [c for c in changes(db, start, feed="normal", style="all_docs") if c.id == "x"]
    assert len(change.revs) == 2


@pytest.mark.parametrize("feed", ["normal", "continuous"])
def test_changes_with_missing_filter_raises(
    couch_server: LocalServer, db: Database, feed: str
) -> None:
    sync_design_docs(db, [BY_GROUP])
    for missing in ("q/nope", "nope/odd", "nope"):
        with pytest.raises(NotFound, match="does not exist"):
            next(changes(db, 0, feed=feed, filter=missing, timeout=1.0))
    assert couch_server.is_alive()  # pouchdb-server would have crashed


def test_changes_continuous_stream_and_stop(db: Database) -> None:
    stop = threading.Event()
    seen: list[Change] = []
    failures: list[BaseException] = []
    start = db.last_seq()

    def follow() -> None:
        try:
            for change in changes(db, start, include_docs=True, heartbeat_ms=200, stop=stop):
                seen.append(change)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    db.save({"_id": "first", "n": 1})
    wait_for(lambda: [c.id for c in seen] == ["first"])
    saved = db.save({"_id": "second"})
    db.delete("second", saved.rev)
    # A live feed may show the intermediate revision too; it must end on the deletion.
    wait_for(lambda: seen[-1].id == "second" and seen[-1].deleted)
    assert seen[0].doc["n"] == 1 and {c.id for c in seen} == {"first", "second"}
    stopped_at = time.monotonic()
    stop.set()
    thread.join(3)
    assert not thread.is_alive() and not failures
    assert time.monotonic() - stopped_at < 1.5  # within a few heartbeats
    # Resuming from the last seq seen misses nothing and repeats nothing.
    db.save({"_id": "third"})
    later = list(changes(db, seen[-1].seq, heartbeat_ms=200, timeout=1.0))
    assert [c.id for c in later] == ["third"]


def test_feed_parsers_on_couchdb_framing() -> None:
    # No Apache CouchDB here: check the parsers on the bytes chttpd_db.erl writes,
    # split at awkward places as TCP may deliver them.
    change = b'{"seq":"2-g1AAAA","id":"job-1","changes":[{"rev":"1-a"}]}'
    sse = (
        b"data: " + change + b'\nid: "2-g1AAAA"\n\n'
        b"event: heartbeat\ndata: \n\n"
        b'data: {"seq":"3-g1","id":"job-2","changes":[{"rev":"2-b"}],"deleted":true}\n'
        b'id: "3-g1"\n\n'
    )
    assert [i["id"] for i in eventsource_items([sse[:17], sse[17:70], sse[70:]])] == [
        "job-1",
        "job-2",
    ]
    continuous = change + b"\n\n\n" + change + b'\n{"last_seq":"3-g1","pending":0}\n'
    parts = [continuous[:9], continuous[9:60], continuous[60:61], continuous[61:]]
    items = list(continuous_items(parts))
    assert [i.get("id") for i in items] == ["job-1", "job-1", None]
    assert items[0]["seq"] == "2-g1AAAA" and items[2]["last_seq"] == "3-g1"


def test_changes_on_missing_database_raises(couch: Couch) -> None:
    missing = couch.database("no_such_db_" + uuid.uuid4().hex[:8])
    with pytest.raises(CouchError):
        list(changes(missing, 0, heartbeat_ms=200, timeout=1.0))


def test_local_docs(db: Database) -> None:
    assert db.get_local("checkpoint") is None
    db.put_local("checkpoint", {"seq": 5})
    db.put_local("checkpoint", {"seq": "12-g1AAA", "_rev": "stale"})
    assert db.get_local("checkpoint")["seq"] == "12-g1AAA"
    assert db.all_docs() == []  # local documents are not listed (nor replicated)


def test_sync_design_docs_is_idempotent(db: Database) -> None:
    assert sync_design_docs(db, [BY_GROUP, VALIDATOR]) == ["_design/q", "_design/rules"]
    assert sync_design_docs(db, [BY_GROUP, VALIDATOR]) == []
    changed = {**BY_GROUP, "views": {"all": {"map": "function (doc) { emit(doc._id); }"}}}
    assert sync_design_docs(db, [changed, VALIDATOR]) == ["_design/q"]
    assert db.get("_design/q")["views"] == changed["views"]
    assert sync_design_docs(db, [{**changed, "_rev": "1-whatever"}]) == []


def test_put_replication_replicates_and_is_idempotent(
    couch: Couch, db: Database, other_db: Database
) -> None:
    # The replication document stays: deleting a running one crashes pouchdb-server.
    # Once the fixtures drop both databases it idles harmlessly.
    db.save({"_id": "before"})
    replicator = couch.replicator()
    doc_id = f"rep-{uuid.uuid4().hex[:8]}"
    wanted = {"source": db.url, "target": other_db.url, "continuous": True}
    assert put_replication(couch.replicator(), doc_id, wanted) is True
    wait_for(lambda: other_db.get("before"))
    db.save({"_id": "after"})
    wait_for(lambda: other_db.get("after"))
    # The replicator's own fields (_replication_state...) are no reason to rewrite.
    assert replicator.get(doc_id)["_replication_state"] == "triggered"
    assert put_replication(replicator, doc_id, wanted) is False
    with pytest.raises(ValueError):
        put_replication(db, doc_id, wanted)


def test_put_replication_with_filter(couch: Couch, db: Database, other_db: Database) -> None:
    sync_design_docs(db, [BY_GROUP])
    db.bulk_docs([{"_id": f"n{n}", "n": n} for n in range(4)])
    doc_id = f"rep-{uuid.uuid4().hex[:8]}"
    wanted = {"source": db.url, "target": other_db.url, "continuous": False,
              "filter": "q/odd", "query_params": {"x": "1"}}
    assert put_replication(couch.replicator(), doc_id, wanted) is True
    wait_for(lambda: couch.replicator().get(doc_id).get("_replication_state") == "completed")
    assert sorted(r["id"] for r in other_db.all_docs()) == ["n1", "n3"]
    assert put_replication(couch.replicator(), doc_id, wanted) is False
    # A missing filter or a selector would crash pouchdb-server: refused before writing.
    with pytest.raises(CouchError, match="does not exist"):
        put_replication(couch.replicator(), f"{doc_id}-x", wanted | {"filter": "q/nope"})
    with pytest.raises(CouchError, match="selector would crash pouchdb-server"):
        put_replication(couch.replicator(), f"{doc_id}-x", {
            "source": db.url, "target": other_db.url, "selector": {"n": 1}})
    assert couch.replicator().get(f"{doc_id}-x") is None


def test_credentials_are_stripped_and_never_shown(couch_server: LocalServer) -> None:
    port = couch_server.url.rsplit(":", 1)[1]
    couch = Couch(f"http://jobdist:s3cret@127.0.0.1:{port}/", retries=1)
    assert couch.url == f"http://127.0.0.1:{port}" and "s3cret" not in repr(couch)
    assert (couch.user, couch.client.authenticator.password) == ("jobdist", "s3cret")
    db = couch.database("jobs")
    assert db.url == f"http://127.0.0.1:{port}/jobs"
    # pouchdb-server in admin party knows no such user: 401, without the password.
    with pytest.raises(Forbidden) as caught:
        db.get("job-1")
    assert "s3cret" not in str(caught.value) and "'job-1'" in str(caught.value)
    explicit = Couch(f"http://127.0.0.1:{port}", user="u", password="p@ss word")
    assert (explicit.user, explicit.client.authenticator.password) == ("u", "p@ss word")


def test_unreachable_server_is_retried_then_unavailable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    couch = Couch("http://admin:secret@127.0.0.1:1", retries=3, timeout=2)
    caplog.set_level(logging.DEBUG, logger="jobdist.couch")
    with pytest.raises(Unavailable) as caught:
        couch.database("jobs").get("job-1")
    message = str(caught.value)
    assert "secret" not in message and "\n" not in message
    assert "'job-1'" in message and "127.0.0.1:1/jobs" in message
    assert len([r for r in caplog.records if r.getMessage().startswith("retrying")]) == 2
    assert all("secret" not in r.getMessage() for r in caplog.records)


def test_stream_on_dead_port_raises_unavailable() -> None:
    couch = Couch(f"http://127.0.0.1:{free_port()}", retries=1)
    with pytest.raises(Unavailable):
        next(changes(couch.database("jobs"), 0, feed="continuous"))


def test_no_retry_on_4xx(couch: Couch, db: Database, caplog: pytest.LogCaptureFixture) -> None:
    statuses: list[int] = []
    hooks = couch.client.get_http_client().hooks["response"]
    hooks.append(lambda resp, **_: statuses.append(resp.status_code))
    caplog.set_level(logging.DEBUG, logger="jobdist.couch")
    sync_design_docs(db, [VALIDATOR])
    statuses.clear()
    with pytest.raises(Forbidden):
        db.save({"_id": "bad", "forbidden_field": 1})
    with pytest.raises(NotFound):
        couch.database("no_such_db_x").get("x")
    assert statuses == [403, 404]
    assert not [r for r in caplog.records if r.getMessage().startswith("retrying")]
