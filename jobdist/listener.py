"""The changes-feed listener: local `_changes` → the work manager's inbox.

It follows the feed from the manager's checkpoint (kept in a `_local/`
document, so a restart resumes where it stopped), reconnects with backoff
when the server goes away, and hands each change over through a bounded
queue. When the manager falls behind, `put` blocks and TCP pushes back on the
server: a burst slows the feed down instead of growing memory or crashing
the listener, which is what happened to the thesis's (section 6.4).

A change whose document we cannot decode (nested too deeply for Python's JSON
parser, say) would fail every reconnect at the same place and stall the site:
the second time the feed fails without moving, the listener passes that change
without its document, and the manager reads (and skips) the job itself.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .couch import CouchError, Database
from .couch_changes import changes
from .periodic import Periodic


@dataclass(frozen=True)
class Changed:
    """A document changed; `seq` is opaque (an int on pouchdb-server, a string on CouchDB).

    `doc` is the winning revision as the feed saw it, with `_conflicts` when
    there are any: an unconflicted job can be decided on without another read.
    """

    doc_id: str
    rev: str
    seq: object
    doc: dict[str, Any] | None = None


def seq_number(seq: object) -> int | None:
    """The numeric part of an update sequence: 12 on pouchdb-server, "12-g1AA..." on CouchDB."""
    if isinstance(seq, int) and not isinstance(seq, bool):
        return seq
    if isinstance(seq, str):
        head = seq.split("-", 1)[0]
        return int(head) if head.isdigit() else None
    return None


def feed_lag(latest: object, received: object) -> int | None:
    """Changes in the database the feed has not delivered yet (approximate on clustered
    CouchDB); None when either sequence says no number."""
    head, got = seq_number(latest), seq_number(received)
    return None if head is None or got is None else max(0, head - got)


class Listener(Periodic):
    """Follows the site's changes feed, handing each change to the manager's inbox;
    reconnects at once when the server ends the stream, with backoff when it fails."""

    what = "changes feed"
    expected_errors = (CouchError, RecursionError)  # a line nested too deeply to decode

    def __init__(self, db: Database, site: str, inbox: queue.Queue[object], since: object,
                 stop: threading.Event, wake: threading.Event,
                 heartbeat_ms: int = 5000,
                 on_change: Callable[[str, object], None] | None = None) -> None:
        super().__init__("listener", site, stop, "jobdist.listener")
        self.db = db
        self.inbox = inbox
        self.since = since
        self.wake = wake
        self.heartbeat_ms = heartbeat_ms
        self.on_change = on_change  # told each change's id and seq (the dashboard's hub)
        self.reconnects = 0
        self.with_docs = True  # False while passing a change whose document we cannot decode
        self.backoff = 0.0
        self.failed_at: object = None

    def wait_before_pass(self) -> float:
        return self.backoff

    def where(self) -> dict[str, Any]:
        return {"since": self.since}

    def pass_once(self) -> None:
        try:
            self.follow()
        except Exception:
            # Failing twice at the same change: its document may be what we cannot
            # decode, so pass it once without documents (the manager reads it itself).
            self.with_docs = self.since != self.failed_at
            self.failed_at = self.since
            self.reconnects += 1
            self.backoff = min(max(self.backoff * 2, 0.1), 5.0)
            raise  # (logged by Periodic.run)
        self.backoff = 0.0  # the server closed the stream cleanly: reconnect at once

    def follow(self) -> None:
        with_docs = self.with_docs
        for change in changes(self.db, self.since, heartbeat_ms=self.heartbeat_ms,
                              stop=self.stop_event, include_docs=with_docs, conflicts=True):
            if not change.id.startswith("_design/") and change.revs:
                self.hand_over(Changed(change.id, change.revs[0], change.seq, change.doc))
                if self.on_change is not None:
                    self.on_change(change.id, change.seq)
            self.since = change.seq
            if not with_docs:  # past the change that failed: documents again
                self.with_docs = True
                return

    def hand_over(self, item: Changed) -> None:
        while not self.stop_event.is_set():
            try:
                self.inbox.put(item, timeout=0.5)
                self.wake.set()
                return
            except queue.Full:
                continue
