"""What the listener and the workers hand the work manager, and the event that wakes it.

The daemon builds the mailbox first: the worker pool reports into it
(`finished` is the pool's `on_done`), the listener puts the feed's changes in
its inbox, and the manager, built last, takes both the pool and the mailbox.
Everything here is thread-safe; the manager alone takes things out.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from itertools import islice
from typing import Any

from .listener import Changed
from .model import StepKey
from .step_run import StepResult
from .workers import Execution

INBOX_SIZE = 1_000  # changes waiting: a burst pushes back on the feed, not on memory
GATHER_QUIET = 0.002  # seconds without a new change that end a burst (see gather)
# A new document may open a `_bulk_docs` of many: pouchdb-server's feed sent a burst of
# six new jobs as one line, then, 9 ms later under load, the other five.
SUBMISSION_QUIET = 0.010
GATHER_MAX = 0.02  # seconds a burst is gathered at most


@dataclass(frozen=True)
class Finished:
    execution: Execution
    result: StepResult

    @property
    def key(self) -> StepKey:
        return self.execution.key


@dataclass(frozen=True)
class Retried:
    key: StepKey
    epoch: int
    worker: str
    detail: str


class Mailbox:
    def __init__(self) -> None:
        # From the listener; bounded so a burst pushes back on the feed, not on memory.
        self.inbox: queue.Queue[object] = queue.Queue(maxsize=INBOX_SIZE)
        # Workers report here, and are served first in every batch: a finished
        # step must not wait behind a burst of replicated changes.
        self.reports: queue.Queue[Finished | Retried] = queue.Queue()
        self.wake = threading.Event()  # set by the listener and the workers
        # Set by the workers and by a write's answer (answered): what the manager waits
        # for while its write is in flight (Settler.write), feed changes aside.
        self.reported = threading.Event()

    def finished(self, execution: Execution, result: StepResult) -> None:
        self.report(Finished(execution, result))

    def retry_reporter(self, key: StepKey, epoch: int, worker: str) -> Callable[[int, str], None]:
        """What a step's run calls before each retry (step_run.run_step's on_retry)."""
        return lambda attempt, detail: self.report(
            Retried(key, epoch, worker, f"attempt {attempt}: {detail}"))

    def report(self, item: Finished | Retried) -> None:
        """Called from a worker's thread: hand over, decide in the manager's."""
        self.reports.put(item)
        self.reported.set()
        self.wake.set()

    def next_changes(self, timeout: float, limit: int) -> list[Changed]:
        """At most `limit` changes, after waiting up to `timeout` seconds for anything
        to arrive (a change or a report) when nothing waits already."""
        if self.inbox.empty() and self.reports.empty():
            self.wake.wait(timeout)
            self.gather(limit)
        self.wake.clear()  # anything arriving from now on sets it again
        return list(islice(drain(self.inbox), limit))

    def gather(self, limit: int) -> None:
        """Woken from idleness by a change: let the rest of its burst arrive (the feed
        streams a `_bulk_docs` of many jobs a line at a time), so that the burst is
        decided and written in one batch, not its first job alone and the others
        behind that write. Waits while the inbox grows, until it has been quiet for
        GATHER_QUIET (SUBMISSION_QUIET after a new document), GATHER_MAX at most; a
        worker's report ends the wait."""
        start = grew_at = time.monotonic()
        quiet = SUBMISSION_QUIET if self._first_is_new() else GATHER_QUIET
        size = self.inbox.qsize()
        while 0 < size < limit and self.reports.empty():
            now = time.monotonic()
            if now - grew_at >= quiet or now - start >= GATHER_MAX:
                return
            time.sleep(GATHER_QUIET)
            before, size = size, self.inbox.qsize()
            if size != before:
                grew_at = time.monotonic()

    def _first_is_new(self) -> bool:
        with self.inbox.mutex:
            first = self.inbox.queue[0] if self.inbox.queue else None
        return isinstance(first, Changed) and first.rev.startswith("1-")

    def reports_now(self) -> Iterable[Finished | Retried]:
        return drain(self.reports)

    def answered(self, _: object = None) -> None:
        """A write in flight got its answer (a future's done callback)."""
        self.reported.set()

    def wait_for_answer(self, answer: Future[Any]) -> bool:
        """Wait until a worker reports or `answer` is in: True when it is in."""
        self.reported.clear()  # (set from here on by anything that should end the wait)
        if answer.done():
            return True
        if self.reports.empty():
            self.reported.wait()
        return answer.done()


def drain(source: queue.Queue[Any]) -> Iterable[Any]:
    """What the queue holds now, without waiting."""
    while True:
        try:
            yield source.get_nowait()
        except queue.Empty:
            return
