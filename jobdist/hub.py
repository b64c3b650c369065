"""A broadcast hub: the site's own changes feed, fanned out to the dashboard's browsers.

The daemon's listener already follows `_changes`; each change it receives is
offered here, and every open event stream (one per browser tab) takes what
changed since it last looked. No tab ever opens a feed of its own on CouchDB,
and nothing polls a job. Offering never blocks the listener: a subscription
keeps the ids of the changed documents, at most `MAX_IDS` of them (past that
it only says "many changed", and the page reloads whatever it shows).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

MAX_CLIENTS = 16  # event streams open at once; more are refused (503)
MAX_IDS = 200  # changed ids a subscription keeps between two reads


@dataclass(frozen=True)
class Batch:
    """What changed since the last read: the ids (None: too many to list) and the
    latest sequence (opaque)."""

    ids: list[str] | None
    seq: object


class Subscription:
    """One event stream's view of the feed: the changes it has not read yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._ids: dict[str, None] = {}  # a dict keeps the order and drops repeats
        self._overflow = False
        self._seq: object = None
        self.closed = False

    def offer(self, doc_id: str, seq: object) -> None:
        with self._lock:
            if len(self._ids) < MAX_IDS:
                self._ids[doc_id] = None
            elif doc_id not in self._ids:
                self._overflow = True
            self._seq = seq
        self._ready.set()

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    def next(self, timeout: float) -> Batch | None:
        """The changes since the last call, waiting up to `timeout`; None when nothing
        changed (or the subscription was closed)."""
        self._ready.wait(timeout)
        with self._lock:
            self._ready.clear()
            if self.closed or (not self._ids and not self._overflow):
                return None
            batch = Batch(None if self._overflow else list(self._ids), self._seq)
            self._ids, self._overflow = {}, False
            return batch


class ChangeHub:
    """The subscriptions of the open event streams; `publish` is the listener's hook."""

    def __init__(self, max_clients: int = MAX_CLIENTS) -> None:
        self.max_clients = max_clients
        self._lock = threading.Lock()
        self._subscriptions: set[Subscription] = set()

    def publish(self, doc_id: str, seq: object) -> None:
        with self._lock:
            subscriptions = list(self._subscriptions)
        for subscription in subscriptions:
            subscription.offer(doc_id, seq)

    def subscribe(self) -> Subscription | None:
        """A new subscription, or None when `max_clients` streams are open already."""
        with self._lock:
            if len(self._subscriptions) >= self.max_clients:
                return None
            subscription = Subscription()
            self._subscriptions.add(subscription)
            return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        subscription.close()
        with self._lock:
            self._subscriptions.discard(subscription)

    @property
    def clients(self) -> int:
        with self._lock:
            return len(self._subscriptions)
