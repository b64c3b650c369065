"""The ledger of a site's steps: each transition leaves the step in the state it names."""

from __future__ import annotations

from jobdist import core
from jobdist.journal import unwritten_start
from jobdist.ledger import Ledger, State

KEY = ("job", 1)


def test_a_launch_that_does_not_happen_leaves_its_booking_as_it_was() -> None:
    ledger = Ledger()
    ledger.book(KEY, now=10.0)
    ledger.launching(KEY, "w1", 2)
    assert ledger.running() == {KEY: core.Running("w1", 2)}
    assert ledger.bookings({KEY: "w1"}, now=15.0) == {}  # a launch to come, not a booking
    ledger.book(KEY, now=12.0)  # planned again in the batch: booked since 10.0 still
    ledger.launching(KEY, "w1", 2)
    ledger.not_launching(KEY)
    assert ledger.state(KEY) is State.BOOKED and ledger.booked_since() == {KEY: 10.0}
    ledger.launching(KEY, "w1", 2)
    ledger.not_launching(KEY)  # (the launch itself: Ledger.started)
    ledger.started(KEY, "w1", 2, after=None)
    assert ledger.run(KEY) == core.Running("w1", 2) and (KEY, 2) in ledger.launched
    assert not ledger.booked_since()


def test_queued_wins_are_served_oldest_first_and_keep_their_time() -> None:
    ledger = Ledger()
    for index, now in enumerate((1.0, 2.0, 3.0)):
        ledger.queue(("job", index), now)
    ledger.queue(("job", 0), now=9.0)  # queued still: since 1.0
    assert list(ledger.queued().items()) == [(("job", 0), 1.0), (("job", 1), 2.0),
                                              (("job", 2), 3.0)]
    ledger.unqueue("job", but={("job", 1)})
    assert ledger.in_state(State.QUEUED) == [("job", 1)]


def test_a_run_launched_ahead_runs_once_its_start_is_settled_until_recorded() -> None:
    ledger = Ledger()
    ledger.started(KEY, "w1", 1, after="end")
    ledger.launched_ahead(KEY, unwritten_start("job", 1, 1, "w1", after="end"))
    assert ledger.ahead() == {KEY: core.Running("w1", 1)} and ledger.unwritten_run(KEY, 1)
    ledger.start_settled(KEY)  # its start written
    assert ledger.state(KEY) is State.RUNNING and not ledger.ahead()
    ledger.ended(KEY)
    run = ledger.run(KEY)
    assert ledger.state(KEY) is State.ENDED and run is not None and run.after == "end"
    ledger.recorded(KEY, epoch=0)  # another run's epoch: not this one
    assert ledger.run(KEY) is not None
    ledger.recorded(KEY, epoch=1)
    assert ledger.state(KEY) is None and (KEY, 1) in ledger.launched


def test_a_deferred_start_falls_due_and_can_be_deferred_again() -> None:
    ledger = Ledger()
    ledger.started(KEY, "w1", 1, after=None)
    ledger.launched_ahead(KEY, unwritten_start("job", 1, 1, "w1"))
    assert ledger.unwritten_run(KEY, 1) == core.Running("w1", 1)
    ledger.defer(KEY, due_at=5.0)
    assert ledger.next_due() == 5.0 and ledger.due(now=4.0, limit=10) == []
    assert ledger.runs(but=[State.DEFERRED]) == {}  # it renews no lease
    ledger.fall_due(KEY)
    assert ledger.state(KEY) is State.DUE and ledger.next_due() is None
    ledger.defer(KEY, due_at=6.0)
    ledger.ended(KEY)  # its start is written with its end
    assert ledger.state(KEY) is State.ENDED and ledger.unwritten_run(KEY, 1) is None
