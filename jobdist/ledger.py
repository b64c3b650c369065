"""The ledger of this site's steps: one record a local step, each in one state.

The plan runner, the manager and the settler ask it what runs here and tell it
what became of each step (its methods are the transitions); the pool view the
core decides on is derived from it (PlanRunner.pool_view). States, with the
moves that leave each (docs/protocol.md, appendix, for launch ahead and deferred
start):

  BOOKED     a worker booked for a claim or start  -> LAUNCHING, QUEUED; gone: unbooked
  QUEUED     won here, waits for a worker          -> gone: decided otherwise
  LAUNCHING  its start in this batch               -> RUNNING: launched; BOOKED/gone: not
  AHEAD      launched before its start's write     -> RUNNING: written or stopped; DEFERRED
  DEFERRED   AHEAD, its write held back (due_at)   -> DUE; ENDED: written with its end
  DUE        DEFERRED fallen due, in this batch    -> RUNNING; DEFERRED: no answer
  RUNNING    launched, its start written or given up -> ENDED: reported
  ENDED      reported, its result not recorded     -> gone: recorded

Every state from AHEAD on is a run of ours (RUNS): it counts as running, its
worker no one else's, until its result is recorded; those launched ahead keep
their journal entry (journal.unwritten_start) until their start is settled.
The runs launched here lately (`launched`) outlive the records: no fencing
token issued here is used twice.

A result the server has not taken is kept not here but in HeldResults: it
outlives its record (freed once its end is planned, entered again as ENDED each
time that write fails), and the status thread reads it while the manager's
thread changes the ledger.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from enum import Enum

from . import core
from .journal import Held
from .memo import remember
from .model import StepKey

MAX_RECENT = 10_000  # (step, epoch) pairs remembered as launched here


class State(Enum):
    BOOKED = "booked"
    QUEUED = "queued"
    LAUNCHING = "launching"
    AHEAD = "ahead"
    DEFERRED = "deferred"
    DUE = "due"
    RUNNING = "running"
    ENDED = "ended"


UNWRITTEN = frozenset({State.AHEAD, State.DEFERRED, State.DUE})  # in a write of ours to come
RUNS = UNWRITTEN | {State.RUNNING, State.ENDED}
IN_BATCH = frozenset({State.LAUNCHING, State.AHEAD, State.DUE})
HERE = RUNS | {State.LAUNCHING, State.QUEUED}  # a step of the job runs here, or is about to
BOOKINGS = frozenset({State.BOOKED, State.LAUNCHING})  # a launch to come may keep a booking


@dataclass(frozen=True)
class Step:
    state: State
    since: float | None = None  # BOOKED, QUEUED, LAUNCHING (None: no booking): monotonic
    worker: str = ""  # LAUNCHING and runs
    epoch: int = 0  # LAUNCHING and runs
    entry: Held | None = None  # UNWRITTEN: the launch's journal entry
    due_at: float = 0.0  # DEFERRED: when its start's write falls due (monotonic)
    after: str | None = None  # runs: the end of the step before it followed (core.follows)

    @property
    def running(self) -> core.Running:
        return core.Running(self.worker, self.epoch, after=self.after)


class Ledger:
    def __init__(self) -> None:
        # In the order each entered its state (a transition re-inserts): queued wins
        # and deferred starts are served oldest first.
        self._steps: dict[StepKey, Step] = {}
        # A start decided on a stale view never launches one again (MAX_RECENT kept).
        self.launched: dict[tuple[StepKey, int], bool] = {}
        # When each worker's last run left the ledger (monotonic): its free time starts there.
        self.worker_freed: dict[str, float] = {}

    def without(self, key: StepKey) -> Ledger:
        """A copy, as if the run `key` were freed now (the view a plan that frees it is
        made on, before it is carried out)."""
        other = copy.copy(self)
        other._steps, other.worker_freed = dict(self._steps), dict(self.worker_freed)
        other.freed(key)
        return other

    # --- asking ---------------------------------------------------------------------

    def state(self, key: StepKey) -> State | None:
        step = self._steps.get(key)
        return None if step is None else step.state

    def in_state(self, state: State, job_id: str | None = None) -> list[StepKey]:
        return [key for key, step in self._steps.items() if step.state is state
                and (job_id is None or key[0] == job_id)]

    def jobs_in(self, states: Collection[State]) -> set[str]:
        return {key[0] for key, step in self._steps.items() if step.state in states}

    def has(self, job_id: str, states: Collection[State]) -> bool:
        return any(key[0] == job_id and step.state in states for key, step in self._steps.items())

    def run(self, key: StepKey) -> core.Running | None:
        """Our run of the step, if any (whatever became of its start)."""
        step = self._steps.get(key)
        return step.running if step is not None and step.state in RUNS else None

    def runs(self, but: Collection[State] = ()) -> dict[StepKey, core.Running]:
        return {key: step.running for key, step in self._steps.items()
                if step.state in RUNS and step.state not in but}

    def running(self) -> dict[StepKey, core.Running]:
        """What counts as running here: our runs, and the launches of this batch."""
        return {key: step.running for key, step in self._steps.items()
                if step.state in RUNS or step.state is State.LAUNCHING}

    def booked_since(self) -> dict[StepKey, float]:
        """When each booking was made (the launching too: a launch may not happen)."""
        return {key: step.since for key, step in self._steps.items()
                if step.state in BOOKINGS and step.since is not None}

    def bookings(self, booked: Mapping[StepKey, str], now: float) -> dict[StepKey, core.Booking]:
        """The pool's bookings, how old each is, but those of this batch's launches."""
        since = self.booked_since()
        return {key: core.Booking(worker, now - since.get(key, now))
                for key, worker in booked.items() if self.state(key) is not State.LAUNCHING}

    def queued(self) -> dict[StepKey, float]:
        """The wins queued here, since when each is, oldest first."""
        return {key: step.since or 0.0 for key, step in self._steps.items()
                if step.state is State.QUEUED}

    def unwritten(self, states: Collection[State] = UNWRITTEN, job_id: str | None = None,
                  ) -> list[tuple[StepKey, Held]]:
        """Our runs launched ahead whose start is not written, with their journal entry."""
        return [(key, step.entry) for key, step in self._steps.items()
                if step.state in states and step.entry is not None
                and (job_id is None or key[0] == job_id)]

    def ahead(self) -> dict[StepKey, core.Running]:
        """The runs whose start is not written (core.PoolView)."""
        return {key: ahead_run(entry) for key, entry in self.unwritten()}

    def unwritten_run(self, key: StepKey, epoch: int) -> core.Running | None:
        """The run (key, epoch) if its start is still unwritten."""
        step = self._steps.get(key)
        if step is None or step.state not in UNWRITTEN or step.entry is None \
                or step.entry.epoch != epoch:
            return None
        return ahead_run(step.entry)

    def due(self, now: float, limit: int) -> list[StepKey]:
        """At most `limit` deferred starts due now, the oldest first."""
        return [key for key, step in self._steps.items()
                if step.state is State.DEFERRED and step.due_at <= now][:limit]

    def next_due(self) -> float | None:
        return min((step.due_at for step in self._steps.values()
                    if step.state is State.DEFERRED), default=None)

    # --- before a run: bookings, queued wins, launches to come ------------------------

    def book(self, key: StepKey, now: float) -> None:
        step = self._steps.get(key)
        if step is None or step.state not in BOOKINGS:
            self._enter(key, Step(State.BOOKED, since=now))
        elif step.since is None:
            self._steps[key] = replace(step, since=now)

    def unbook(self, key: StepKey) -> None:
        step = self._steps.get(key)
        if step is not None and step.state is State.BOOKED:
            del self._steps[key]
        elif step is not None and step.state is State.LAUNCHING:
            self._steps[key] = replace(step, since=None)

    def queue(self, key: StepKey, now: float) -> None:
        if self.state(key) is not State.QUEUED:
            self._enter(key, Step(State.QUEUED, since=now))

    def unqueue(self, job_id: str, but: Collection[StepKey]) -> None:
        for key in self.in_state(State.QUEUED, job_id=job_id):
            if key not in but:
                del self._steps[key]

    def launching(self, key: StepKey, worker: str, epoch: int) -> None:
        """Its start is planned; a run of ours already is that start's own (written late)."""
        step = self._steps.get(key)
        if step is not None and step.state in RUNS:
            return
        since = step.since if step is not None and step.state in BOOKINGS else None
        self._enter(key, Step(State.LAUNCHING, since=since, worker=worker, epoch=epoch))

    def not_launching(self, key: StepKey) -> None:
        """No longer a launch to come: its booking, if any, stays."""
        step = self._steps.get(key)
        if step is None or step.state is not State.LAUNCHING:
            return
        if step.since is None:
            del self._steps[key]
        else:
            self._steps[key] = Step(State.BOOKED, since=step.since)

    # --- runs ---------------------------------------------------------------------------

    def started(self, key: StepKey, worker: str, epoch: int, after: str | None) -> None:
        """Launched, after the end of the step before `after` (core.follows)."""
        self._enter(key, Step(State.RUNNING, worker=worker, epoch=epoch, after=after))
        remember(self.launched, (key, epoch), True, MAX_RECENT)

    def launched_ahead(self, key: StepKey, entry: Held) -> None:
        self._enter(key, replace(self._steps[key], state=State.AHEAD, entry=entry))

    def defer(self, key: StepKey, due_at: float) -> None:
        self._enter(key, replace(self._steps[key], state=State.DEFERRED, due_at=due_at))

    def fall_due(self, key: StepKey) -> None:
        self._enter(key, replace(self._steps[key], state=State.DUE))

    def start_settled(self, key: StepKey) -> None:
        """Its start written, or never to be (stopped, killed): an ordinary run now."""
        step = self._steps.get(key)
        if step is not None and step.state in UNWRITTEN:
            self._enter(key, Step(State.RUNNING, worker=step.worker, epoch=step.epoch,
                                  after=step.after))

    def ended(self, key: StepKey) -> None:
        """Reported: a deferred start is written with its end."""
        step = self._steps.get(key)
        if step is not None and step.state in (State.RUNNING, State.DEFERRED):
            self._enter(key, Step(State.ENDED, worker=step.worker, epoch=step.epoch,
                                  after=step.after))

    def freed(self, key: StepKey) -> None:
        """Its end is planned: its worker is free to the plans after it."""
        if self.state(key) in RUNS:
            self._drop_run(key)

    def unrecorded(self, key: StepKey, worker: str, epoch: int) -> None:
        """Its result is not recorded yet (held): it counts as running until it is."""
        run = self.run(key)
        if run is None or run.epoch != epoch:
            self._enter(key, Step(State.ENDED, worker=worker, epoch=epoch))

    def recorded(self, key: StepKey, epoch: int) -> None:
        """Its result is written, or its job is gone."""
        run = self.run(key)
        if run is not None and run.epoch == epoch:
            self._drop_run(key)

    def _drop_run(self, key: StepKey) -> None:
        self.worker_freed[self._steps.pop(key).worker] = time.monotonic()

    def _enter(self, key: StepKey, step: Step) -> None:
        self._steps.pop(key, None)
        self._steps[key] = step


def ahead_run(entry: Held) -> core.Running:
    """A run launched ahead, as its journal entry has it (when, and after what)."""
    return core.Running(entry.worker, entry.epoch, entry.result.start_time, entry.after)
