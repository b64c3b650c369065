"""A broadcast hub: the site's own changes feed, fanned out to the dashboard's browsers.

The daemon's listener already follows `_changes`; it publishes each change here,
and every open event stream (one per browser tab) reads what was published since
its last read, knowing only how many changes it has read. No tab opens a feed of
its own on CouchDB and nothing polls a job. The hub keeps the last `MAX_IDS`
changes: a reader further behind is told "many changed" (and its page reloads
whatever it shows). Publishing holds a lock only to append.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

MAX_CLIENTS = 16  # event streams open at once; more are refused (503)
MAX_IDS = 200  # changes kept for the readers behind


class ChangeHub:
    """The recent changes, and how many readers there are; `publish` is the listener's
    hook."""

    def __init__(self, max_clients: int = MAX_CLIENTS) -> None:
        self.max_clients = max_clients
        self.clients = 0
        self.published = 0  # changes published so far: where a new reader starts
        self._recent: deque[tuple[str, object]] = deque(maxlen=MAX_IDS)  # id, seq
        self._changed = threading.Condition()

    def publish(self, doc_id: str, seq: object) -> None:
        with self._changed:
            self._recent.append((doc_id, seq))
            self.published += 1
            self._changed.notify_all()

    def read(self, seen: int, timeout: float,
             stop: Callable[[], bool]) -> tuple[int, dict[str, Any] | None]:
        """The changes after the first `seen`, waiting up to `timeout` (or until `stop`
        says so after a `wake`): how many are published now, and {"ids": the changed
        ids (None: too many to list), "seq": the latest}, or None when nothing changed."""
        with self._changed:
            self._changed.wait_for(lambda: self.published > seen or stop(), timeout)
            new = self.published - seen
            if new == 0:
                return seen, None
            ids = [doc_id for doc_id, _ in list(self._recent)[-new:]]
            return self.published, {"ids": list(dict.fromkeys(ids)) if new <= len(ids) else None,
                                    "seq": self._recent[-1][1]}

    def wake(self) -> None:
        """Have every waiting reader look at its `stop` again."""
        with self._changed:
            self._changed.notify_all()

    def join(self) -> bool:
        """Count one more reader; False when `max_clients` read already."""
        with self._changed:
            if self.clients >= self.max_clients:
                return False
            self.clients += 1
            return True

    def leave(self) -> None:
        with self._changed:
            self.clients -= 1
