"""Step results the server has not taken yet: a result is never lost.

A result whose write fails (the server down, an answer lost) is kept in the
journal on disk and here, and tried again with a back-off until a write
records it. Until then its run still counts as running at this site (the
ledger keeps it, State.ENDED): the site does not release the step, and its
heartbeat keeps renewing the lease. Here: the results and when each is tried again.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from .journal import Held, Journal, JournalFull
from .logs import EventLog
from .model import StepKey

RETRY_FIRST = 0.1  # seconds before a held result is tried again; doubles each time
RETRY_MAX = 2.0  # short beside any lease: a result is written soon after the server is back


class HeldResults:
    """The held results by step, each with when it is due again and its back-off."""

    def __init__(self, journal: Journal, counts: Counter[str], log: EventLog) -> None:
        self.journal = journal
        self.counts = counts
        self.log = log
        self.by_key: dict[StepKey, Held] = {}
        self._retry: dict[StepKey, tuple[float, float]] = {}  # key -> (due, delay)

    def __contains__(self, key: object) -> bool:
        return key in self.by_key

    def __len__(self) -> int:
        return len(self.by_key)

    def replay(self) -> list[Held]:
        """The results an earlier run of the daemon held, due at once."""
        for held in self.journal.load():
            self._keep(held, delay=0.0)
        return list(self.by_key.values())

    def hold(self, held: Held) -> None:
        """Keep a result on disk, and try it again soon."""
        try:
            self.journal.keep(held)
        except (OSError, JournalFull) as error:
            self.counts["journal_errors"] += 1
            self.log.error("result held in memory only", job=held.job_id, step=held.step,
                           epoch=held.epoch, error=error)
        self.counts["results_held"] += 1
        self.log.warning("result held until the server takes it", job=held.job_id,
                         step=held.step, epoch=held.epoch)
        self._keep(held, delay=RETRY_FIRST)

    def back_off(self, key: StepKey) -> bool:
        """A held result failed again: try it later, twice as late (False: not held)."""
        if key not in self.by_key:
            return False
        _, delay = self._retry[key]
        self._retry[key] = (time.monotonic() + delay, min(2 * delay, RETRY_MAX))
        return True

    def written(self, held: Held) -> None:
        """The result is recorded, or nothing is left to record it in: forget it. The
        job's later results, which waited behind it (before), are due at once."""
        self.journal.forget(held)  # (or the entry of its launch ahead: unwritten_start)
        if held.key not in self.by_key:
            return
        del self.by_key[held.key], self._retry[held.key]
        for key, (_, delay) in self._retry.items():
            if key[0] == held.job_id:
                self._retry[key] = (time.monotonic(), delay)
        self.counts["results_replayed"] += 1
        self.log.info("held result written", job=held.job_id, step=held.step, epoch=held.epoch,
                      held_for=time.time() - held.since)

    def due(self) -> list[Held]:
        now = time.monotonic()
        return [held for key, held in list(self.by_key.items()) if self._retry[key][0] <= now]

    def before(self, key: StepKey) -> bool:
        """Is the result of an earlier step of the job held? A job's results are written
        in step order (a later step can end here while an earlier one's result waits)."""
        return any(job_id == key[0] and step < key[1] for job_id, step in self.by_key)

    def status(self) -> dict[str, Any]:
        """For /status and /metrics."""
        held = list(self.by_key.values())  # one C-level copy: safe beside the manager thread
        oldest = min((entry.since for entry in held), default=None)
        return {"held": len(held), "on_disk": len(self.journal),
                "oldest_seconds": None if oldest is None else round(time.time() - oldest, 3),
                "directory": str(self.journal.directory)}

    def _keep(self, held: Held, delay: float) -> None:
        self.by_key[held.key] = held
        self._retry[held.key] = (time.monotonic() + delay, max(delay, RETRY_FIRST))
