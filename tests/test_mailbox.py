"""The mailbox: what the listener and the workers hand the manager, and how it waits."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from jobdist import mailbox as mailbox_module
from jobdist.listener import Changed
from jobdist.mailbox import GATHER_MAX, GATHER_QUIET, SUBMISSION_QUIET, Mailbox, Retried


def change(n: int, generation: int = 1) -> Changed:
    return Changed(f"job-{n}", f"{generation}-{n}", n)


class FeedWhileWaiting:
    """The mailbox's clock: each of its sleeps passes that much time, during which the
    listener hands over what `arriving` says (no real waiting, no timing in the test)."""

    def __init__(self, mailbox: Mailbox, arriving: Callable[[int], list[object]]) -> None:
        self.mailbox = mailbox
        self.arriving = arriving  # sleep number -> what arrives meanwhile
        self.now = 0.0
        self.sleeps = 0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for item in self.arriving(self.sleeps):
            queue = self.mailbox.reports if isinstance(item, Retried) else self.mailbox.inbox
            queue.put(item)  # type: ignore[arg-type]
        self.sleeps += 1


def woken_by(mailbox: Mailbox, first: Changed) -> None:
    """The manager waited, idle; the listener hands over a burst's first change."""
    mailbox.inbox.put(first)
    mailbox.wake.set()


def test_a_burst_after_idleness_is_taken_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rest of the burst streams in behind the change that woke the manager: it is
    decided in the same batch, not behind the first job's write."""
    mailbox = Mailbox()
    clock = FeedWhileWaiting(mailbox, lambda n: [change(n + 1, 3)] if n < 4 else [])
    monkeypatch.setattr(mailbox_module, "time", clock)
    woken_by(mailbox, change(0, 3))
    mailbox.gather(limit=100)
    assert mailbox.inbox.qsize() == 5  # gathered until one quiet sleep
    assert clock.now == pytest.approx(5 * GATHER_QUIET)


def test_new_documents_are_given_a_longer_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """A submission's `_bulk_docs` may reach the feed in parts some milliseconds apart:
    after a new document, a pause shorter than SUBMISSION_QUIET does not end the burst."""
    arrivals = {0: [change(1)], 3: [change(2), change(3)]}  # a pause of 3 quiet sleeps
    mailbox = Mailbox()
    clock = FeedWhileWaiting(mailbox, lambda n: arrivals.get(n, []))
    monkeypatch.setattr(mailbox_module, "time", clock)
    woken_by(mailbox, change(0))
    mailbox.gather(limit=100)
    assert mailbox.inbox.qsize() == 4
    assert 3 * GATHER_QUIET < SUBMISSION_QUIET
    assert clock.now == pytest.approx(4 * GATHER_QUIET + SUBMISSION_QUIET)
    assert clock.now < GATHER_MAX
    # The same pause after a changed document ends the wait: it costs every decision.
    mailbox = Mailbox()
    clock = FeedWhileWaiting(mailbox, lambda n: arrivals.get(n, []))
    monkeypatch.setattr(mailbox_module, "time", clock)
    woken_by(mailbox, change(0, 2))
    mailbox.gather(limit=100)
    assert mailbox.inbox.qsize() == 2


def test_the_wait_for_a_burst_is_bounded_and_a_report_ends_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    mailbox = Mailbox()
    clock = FeedWhileWaiting(mailbox, lambda n: [change(n + 1)])  # a stream that never pauses
    monkeypatch.setattr(mailbox_module, "time", clock)
    woken_by(mailbox, change(0))
    mailbox.gather(limit=1000)
    assert clock.now == pytest.approx(GATHER_MAX, abs=GATHER_QUIET)
    # A step ended meanwhile: its report is not kept waiting for the burst.
    mailbox = Mailbox()
    clock = FeedWhileWaiting(mailbox, lambda n: [change(n + 1), Retried(("j", 0), 1, "w", "")])
    monkeypatch.setattr(mailbox_module, "time", clock)
    woken_by(mailbox, change(0))
    mailbox.gather(limit=1000)
    assert clock.sleeps == 1
    # Nor is a full batch.
    mailbox = Mailbox()
    clock = FeedWhileWaiting(mailbox, lambda n: [change(n + 1)])
    monkeypatch.setattr(mailbox_module, "time", clock)
    woken_by(mailbox, change(0))
    mailbox.gather(limit=3)
    assert mailbox.inbox.qsize() == 3


def test_a_write_in_flight_is_awaited_until_a_report_or_its_answer() -> None:
    """Settler.write: a worker's report ends the wait (False: serve it), the answer
    ends it (True), and a change of the feed does not."""
    mailbox, answer = Mailbox(), Future[list[object]]()
    answer.add_done_callback(mailbox.answered)
    report = mailbox.retry_reporter(("job-1", 0), 1, "w1")
    threading.Timer(0.05, report, (2, "exit 1")).start()
    assert mailbox.wait_for_answer(answer) is False
    assert [item.key for item in mailbox.reports_now()] == [("job-1", 0)]
    threading.Timer(0.05, mailbox.inbox.put, (change(1),)).start()
    threading.Timer(0.05, mailbox.wake.set).start()
    threading.Timer(0.2, answer.set_result, ([],)).start()
    assert mailbox.wait_for_answer(answer) is True
    assert mailbox.inbox.qsize() == 1  # (the feed's change waits for the next round)
    assert mailbox.wait_for_answer(answer) is True  # an answer in: no wait at all
