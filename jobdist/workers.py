"""The site's worker slots: a pool that runs steps (step_run) in daemon threads.

`WorkerPool` holds the slots (free, booked, busy); `kill_orphans` kills the step process
groups a killed daemon left behind.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .logs import EventLog
from .model import Progress, StepKey
from .processes import live_processes, signal_group
from .step_output import ProgressFile, clear_progress_dir
from .step_run import RetryCallback, StepResult, allow_all, not_run, run_step


@dataclass(eq=False)
class Execution:
    """A step running on a worker slot; compared by identity."""

    key: StepKey  # (job_id, step index)
    epoch: int
    worker: str
    started_at: float  # time.monotonic()
    cancel: threading.Event
    log: EventLog = field(repr=False)
    thread: threading.Thread = field(init=False, repr=False)
    progress: Progress | None = None  # the latest report, from stdout's reader or the file
    progress_file: ProgressFile | None = None

    def poll_progress(self) -> Progress | None:
        """The latest report, after a look at the progress file."""
        report = None if self.progress_file is None else self.progress_file.poll()
        if report is not None:
            self.progress = report
        return self.progress


DoneCallback = Callable[[Execution, StepResult], None]


class WorkerPool:
    """The site's worker slots, named f"{site}/w{n}", each free, booked (reserved for a
    claim) or busy (running)."""

    def __init__(self, site: str, size: int, on_done: DoneCallback,
                 allows: Callable[[str], bool] = allow_all,
                 progress_dir: Path | None = None) -> None:
        self._site = site
        # The steps' progress files: in the system's temporary directory unless given
        # (the daemon gives its own, cleared at start: a killed daemon leaves files).
        self._progress_dir = progress_dir
        if progress_dir is not None:
            clear_progress_dir(progress_dir)
        self._on_done = on_done
        self._allows = allows
        self._lock = threading.Lock()
        self._slots: list[str] = []  # active slots, in name order; a booked or busy slot
        # not among them is retiring: it goes once free
        self._booked: dict[StepKey, str] = {}
        self._busy: dict[StepKey, Execution] = {}
        self._free_at: dict[str, float] = {}  # when each slot last became free (monotonic)
        self._closed = False
        self.resize(size)

    # -- queries --

    def is_booked(self, key: StepKey) -> bool:
        with self._lock:
            return key in self._booked

    def is_busy(self, key: StepKey) -> bool:
        with self._lock:
            return key in self._busy

    def free_since(self) -> dict[str, float]:
        """When each free slot became free (time.monotonic), in the order `book` takes them."""
        with self._lock:
            return {} if self._closed else {worker: self._free_at[worker]
                                            for worker in self._free_slots()}

    def bookings(self) -> dict[StepKey, str]:
        with self._lock:
            return dict(self._booked)

    def progress_of(self, key: StepKey) -> Progress | None:
        """The latest progress report of the step running as `key`, if any."""
        with self._lock:
            execution = self._busy.get(key)
        return None if execution is None else execution.poll_progress()

    def snapshot(self) -> dict[str, Any]:
        """The pool's state for /status."""
        now = time.monotonic()
        with self._lock:
            return {
                "size": len(self._slots),
                "free": len(self._free_slots()),
                "booked": len(self._booked),
                "busy": len(self._busy),
                "running": [{"job_id": job_id, "step": step, "epoch": execution.epoch,
                             "worker": execution.worker,
                             "seconds": round(now - execution.started_at, 1)}
                            for (job_id, step), execution in self._busy.items()],
            }

    # -- booking and running --

    def book(self, key: StepKey, worker: str | None = None) -> str | None:
        """Reserve a free slot for `key` (`worker` if it is free); its name, or None if
        no slot is free."""
        with self._lock:
            if key in self._busy:
                return self._busy[key].worker
            if key not in self._booked:
                chosen = self._free_slot(worker)
                if chosen is None:
                    return None
                self._booked[key] = chosen
            return self._booked[key]

    def unbook(self, key: StepKey) -> None:
        """Free the slot booked for `key` (no-op if not booked; a busy slot is left alone)."""
        with self._lock:
            worker = self._booked.pop(key, None)
            if worker is not None:
                self._free_at[worker] = time.monotonic()

    def start(
        self,
        key: StepKey,
        epoch: int,
        step: Mapping[str, Any],
        env: Mapping[str, str],
        on_retry: RetryCallback | None = None,
    ) -> Execution:
        """Run the step on the key's booked slot (or a free one) in a daemon thread.

        When the step ends its slot is freed first, then on_done(execution, result) is
        called from the worker thread. The command also sees JOBDIST_WORKER and
        JOBDIST_PROGRESS_FILE (unless no file could be made).
        """
        with self._lock:
            worker = self._take_slot_for(key)
            log = EventLog("jobdist.workers", job=key[0], step=key[1], site=self._site,
                           worker=worker)
            execution = Execution(key, epoch, worker, time.monotonic(), threading.Event(), log)
            execution.progress_file = progress_file = _new_progress_file(self._progress_dir, log)
            extra = {} if progress_file is None else {
                "JOBDIST_PROGRESS_FILE": str(progress_file.path)}
            execution.thread = threading.Thread(
                target=self._execute,
                args=(execution, step, {**env, "JOBDIST_WORKER": worker, **extra}, on_retry),
                name=f"jobdist-{worker}",
                daemon=True,
            )
            self._busy[key] = execution
        execution.log.info("step started", epoch=epoch)
        execution.thread.start()
        return execution

    def cancel(self, key: StepKey) -> bool:
        """Ask the execution running `key` to stop; False if `key` is not running."""
        with self._lock:
            execution = self._busy.get(key)
        if execution is None:
            return False
        execution.log.info("cancelling")
        execution.cancel.set()
        return True

    # -- size and lifetime --

    def resize(self, size: int) -> None:
        """Grow at once; shrink by dropping free slots now and booked or busy ones once
        free, so that a resize never kills running work."""
        if size < 0:
            raise ValueError(f"pool size must be >= 0, not {size}")
        with self._lock:
            while len(self._slots) < size:
                self._add_slot()
            while len(self._slots) > size:
                self._retire_slot()

    def shutdown(self, grace: float) -> list[Execution]:
        """Stop taking work, give running steps `grace` seconds, then cancel the rest;
        returns those cancelled, once all have ended."""
        with self._lock:
            self._closed = True
            executions = list(self._busy.values())
        deadline = time.monotonic() + grace
        for execution in executions:
            execution.thread.join(max(0.0, deadline - time.monotonic()))
        stragglers = [execution for execution in executions if execution.thread.is_alive()]
        for execution in stragglers:
            execution.log.info("shutdown cancels")
            execution.cancel.set()
        for execution in stragglers:
            execution.thread.join()
        return stragglers

    # -- internals (the caller holds the lock unless said otherwise) --

    def _execute(
        self,
        execution: Execution,
        step: Mapping[str, Any],
        env: Mapping[str, str],
        on_retry: RetryCallback | None,
    ) -> None:
        """The worker thread's body (no lock held): run, free the slot, then report."""
        try:
            result = run_step(step, env, execution.cancel, on_retry, self._allows,
                              on_progress=lambda report: setattr(execution, "progress", report))
        except Exception as error:  # the slot must be freed and the end reported anyway
            execution.log.exception("step crashed")
            result = not_run(f"worker error: {type(error).__name__}: {error}",
                             time.monotonic() - execution.started_at)
        result = dataclasses.replace(result, progress=execution.poll_progress())  # either source
        if execution.progress_file is not None:
            execution.progress_file.remove()
        with self._lock:
            del self._busy[execution.key]
            self._free_at[execution.worker] = time.monotonic()
        try:
            self._on_done(execution, result)
        except Exception:
            execution.log.exception("on_done failed")

    def _take_slot_for(self, key: StepKey) -> str:
        if key in self._busy:
            raise RuntimeError(f"step {key} is already running on {self._busy[key].worker}")
        if self._closed:
            raise RuntimeError("the worker pool is shut down")
        worker = self._booked.pop(key, None) or self._free_slot()
        if worker is None:
            raise RuntimeError(f"no free worker slot for step {key}")
        return worker

    def _free_slot(self, preferred: str | None = None) -> str | None:
        """`preferred` if it is free, else the first free slot (None: none, or shut down)."""
        free = [] if self._closed else self._free_slots()
        return preferred if preferred in free else next(iter(free), None)

    def _free_slots(self) -> list[str]:
        taken = self._busy_or_booked_workers()
        return [worker for worker in self._slots if worker not in taken]

    def _busy_or_booked_workers(self) -> set[str]:
        return set(self._booked.values()) | {e.worker for e in self._busy.values()}

    def _retire_slot(self) -> None:
        """Drop the highest-numbered free slot, else the highest-numbered slot: booked or
        busy, it keeps its step (retiring) and goes once free."""
        self._slots.remove(max(self._free_slots() or self._slots, key=_slot_number))

    def _add_slot(self) -> None:
        """Bring back a retiring slot if there is one (the pool never runs more steps than
        its size), else add the lowest unused name."""
        retiring = self._busy_or_booked_workers().difference(self._slots)
        names = (f"{self._site}/w{number}" for number in itertools.count(1))
        worker = min(retiring, key=_slot_number) if retiring else next(
            name for name in names if name not in self._slots)
        self._free_at[worker] = time.monotonic()
        bisect.insort(self._slots, worker, key=_slot_number)


def _new_progress_file(directory: Path | None, log: EventLog) -> ProgressFile | None:
    try:
        return ProgressFile(directory)
    except OSError as error:  # no room in the temporary directory: stdout reports still work
        log.warning("no progress file for the step", error=error)
        return None


def _slot_number(worker: str) -> int:
    return int(worker.rsplit("/w", 1)[1])


def kill_orphans(site: str, couch: str) -> list[int]:
    """Kill the step process groups a previous daemon of this site left behind.

    A daemon killed with SIGKILL cannot stop its steps, which live in process
    groups of their own; its successor would run them again next to the old
    ones. Steps carry JOBDIST_SITE and JOBDIST_COUCH in their environment, so at
    start-up, before it runs anything, a daemon finds and kills them.
    """
    marker = {f"JOBDIST_SITE={site}".encode(), f"JOBDIST_COUCH={couch}".encode()}
    groups = sorted({group for process, group in live_processes()
                     if marker <= _environment(process)})
    for pgid in groups:
        signal_group(pgid, signal.SIGKILL)
        EventLog("jobdist.workers", site=site).warning(
            "killed orphaned step process group", pgid=pgid)
    return groups


def _environment(process: Path) -> set[bytes]:
    try:
        return set((process / "environ").read_bytes().split(b"\0"))
    except OSError:  # gone, or not ours to read
        return set()
