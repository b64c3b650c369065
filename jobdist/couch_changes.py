"""A database's `_changes` feed: one batch, or a stream followed line by line.

`_changes` sequences are strings on CouchDB and integers on pouchdb-server, so
they are opaque values: never compared, only handed back as `since`.

The daemon's feed is the Cloudant SDK's `post_changes_as_stream` read line by
line (continuous, or eventsource on Apache CouchDB): the SDK's `ChangesFollower`
polls with `longpoll`, a request per batch, and converts every change into
model objects; docs/performance.md has the measurement that kept ours.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import requests
import sseclient

from .couch import CouchError, Database
from .model import Doc


@dataclass(frozen=True)
class Change:
    seq: object  # opaque: str on CouchDB, int on pouchdb-server
    id: str
    revs: list[str]
    deleted: bool
    doc: Doc | None


def changes(
    db: Database,
    since: object = 0,
    *,
    include_docs: bool = False,
    conflicts: bool = False,
    feed: str = "auto",
    heartbeat_ms: int = 10000,
    filter: str | None = None,
    stop: threading.Event | None = None,
    timeout: float | None = None,
    style: str = "main_only",
) -> Iterator[Change]:
    """Changes of `db` after `since` (an opaque seq from an earlier Change or `last_seq`).

    feed="normal" returns after the current batch; "continuous" and
    "eventsource" stream until the server closes the stream, `stop` is set
    or `timeout` seconds have passed. Both are checked between lines, and
    the server sends a heartbeat every `heartbeat_ms`, so a stop is noticed
    within about one heartbeat. "auto" picks eventsource on Apache CouchDB
    and continuous elsewhere (pouchdb-server has no eventsource). Streams
    connect on the first `next()` and are not retried: reconnecting is the
    caller's decision. feed="normal" reads its batch when called.
    """
    if feed == "auto":
        feed = "eventsource" if db.couch.is_apache_couchdb() else "continuous"
    options: Doc = {
        "since": since if isinstance(since, str) else json.dumps(since),
        "include_docs": include_docs,
        "conflicts": conflicts or None,
        "style": style,
    }
    if filter is not None:
        if not filter.startswith("_") and not db.couch.is_apache_couchdb():
            db.require_filter(filter)
        options["filter"] = filter
    if feed == "normal":
        return _batch(db, options)
    if feed not in ("continuous", "eventsource"):
        raise ValueError(f"unknown changes feed {feed!r}")
    options |= {"feed": feed, "heartbeat": heartbeat_ms}
    return _stream(db, options, heartbeat_ms / 1000, stop, timeout)


def _batch(db: Database, options: Doc) -> Iterator[Change]:
    body = db.call("read changes", db.couch.client.post_changes, **options)
    return iter([_change(item) for item in body["results"]])


def _stream(
    db: Database,
    options: Doc,
    heartbeat: float,
    stop: threading.Event | None,
    timeout: float | None,
) -> Iterator[Change]:
    what = f"follow changes of {db.url}"
    deadline = None if timeout is None else time.monotonic() + timeout

    def should_stop() -> bool:
        return (stop is not None and stop.is_set()) or (
            deadline is not None and time.monotonic() >= deadline
        )

    # A read timeout a little above the heartbeat notices a dead connection. (The client
    # asks for no gzip, couch_sdk.new_client: a gzipped stream is buffered by the server.)
    client = db.couch.stream_client(heartbeat * 1.5 + 1.0)
    with db.couch.errors(what):
        resp = client.post_changes_as_stream(db.name, **options).get_result()
    with resp, db.couch.errors(what):
        parse = eventsource_items if options["feed"] == "eventsource" else continuous_items
        try:
            for item in parse(_chunks(resp, should_stop)):
                if should_stop() or "id" not in item:  # {"last_seq": ...} ends the feed
                    return
                yield _change(item)
        except ValueError as exc:
            raise CouchError(db.couch.clean(f"{what}: bad feed line: {exc}")) from exc


def continuous_items(chunks: Iterable[bytes]) -> Iterator[Doc]:
    """The JSON objects of a `feed=continuous` body: one per line, blank lines are heartbeats."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from (json.loads(line) for line in lines if line.strip())
    if pending.strip():
        yield json.loads(pending)


def eventsource_items(chunks: Iterable[bytes]) -> Iterator[Doc]:
    """The JSON objects of a `feed=eventsource` body (CouchDB only)."""
    for event in sseclient.SSEClient(iter(chunks)).events():
        if event.event == "message":  # CouchDB's heartbeats are "heartbeat" events
            yield json.loads(event.data)


def _chunks(resp: requests.Response, should_stop: Callable[[], bool]) -> Iterator[bytes]:
    # chunk_size=None: each chunk as it arrives, so every heartbeat lets us check `stop`.
    for chunk in resp.iter_content(chunk_size=None):
        if should_stop():
            return
        yield chunk


def _change(item: Doc) -> Change:
    return Change(
        seq=item.get("seq"),
        id=item["id"],
        revs=[c["rev"] for c in item.get("changes", [])],
        deleted=bool(item.get("deleted", False)),
        doc=item.get("doc"),
    )
