"""The result journal: step results a site could not write yet, kept on local disk.

A step may end while its site's CouchDB does not answer (killed, restarting,
out of disk). Its result must not be thrown away: the step would run again
elsewhere once its lease ran out, with no site having failed. So the manager
keeps every result it cannot record here, durably (`HeldResults`), and tries it
again with a back-off until a write records it (the decision core fences it: a
result whose epoch is no longer current is recorded as `stale_finish`, never as
progress). Until then its run counts as running here (the ledger keeps it,
State.ENDED): the step is not released, and its lease is renewed. A daemon
restarted during the outage reads the journal back before it re-decides
anything, so it does not release the steps whose results it holds.

The journal also holds each step launched ahead of its start (docs/protocol.md,
"Launch ahead") until the start is written: as the result "stopped before its
start was written" (`unwritten_start`). A daemon that dies in between comes
back to it and records the run as stopped, its start included, so the step
runs again in a new epoch, never twice in one. The run's own result, held or
written, takes the entry's place. Such an entry is not fsynced: it guards
against the daemon's death, and the page cache outlives that; a machine that
dies takes the run with it, and a run gone with no report left anywhere
needs no fence (fsyncing each launch cost a fifth of the throughput under a
burst: docs/performance.md).

One file an entry, written to a temporary name, fsynced, renamed and the
directory fsynced: a crash leaves either the whole entry or none, never half a
line of a shared log to repair. Entries are few (at most one per worker that
ended during an outage) and bounded by `limit`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .clock import utc_now
from .logs import EventLog
from .model import StepKey
from .step_run import StepResult

SUFFIX = ".json"
DEFAULT_LIMIT = 10_000
RETRY_FIRST = 0.1  # seconds before a held result is tried again; doubles each time
RETRY_MAX = 2.0  # short beside any lease: a result is written soon after the server is back


class JournalFull(Exception):
    """The journal holds `limit` entries already: the result stays in memory only."""


@dataclass(frozen=True)
class Held:
    """A step result not yet written to CouchDB: which execution, and how it ended."""

    job_id: str
    step: int
    epoch: int
    worker: str
    result: StepResult
    since: float  # wall-clock time (time.time()) the result was first held
    # For a run launched ahead of its start: the end of the step before that its
    # start followed (core.follows); None when unknown (an entry older than the field).
    after: str | None = None

    @property
    def key(self) -> StepKey:
        return self.job_id, self.step

    @property
    def name(self) -> str:
        """The entry's file name: one execution (job, step, epoch) is one entry."""
        digest = hashlib.blake2b(self.job_id.encode("utf-8"), digest_size=16).hexdigest()
        return f"{digest}-{self.step}-{self.epoch}{SUFFIX}"  # ids may hold `/`, be long

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "result": asdict(self.result)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Held:
        return cls(job_id=str(data["job_id"]), step=int(data["step"]), epoch=int(data["epoch"]),
                   worker=str(data["worker"]), result=StepResult(**data["result"]),
                   since=float(data["since"]),
                   after=None if data.get("after") is None else str(data["after"]))


STOPPED_UNWRITTEN = "the site stopped before this start was written"


def unwritten_start(job_id: str, step: int, epoch: int, worker: str,
                    after: str | None = None) -> Held:
    """The entry of a step launched ahead of its start: what to record if the daemon
    dies before the start is written (a stopped run); `after`: see Held."""
    now = utc_now()
    result = StepResult(ok=False, used_alt=False, exit_code=None, attempts=0, exec_time=0.0,
                        start_time=now, finish_time=now, stdout="", stderr="",
                        reason=STOPPED_UNWRITTEN, cancelled=True)
    return Held(job_id, step, epoch, worker, result, time.time(), after)


class Journal:
    """A directory of held results; `keep` returns once the entry is on disk."""

    def __init__(self, directory: Path, limit: int = DEFAULT_LIMIT) -> None:
        self.directory = Path(directory)
        self.limit = limit
        if not self.directory.is_dir():
            self.directory.mkdir(parents=True, mode=0o700)
            _sync_directory(self.directory.parent)  # the new directory survives a crash
        self._names = {path.name for path in self.directory.glob(f"*{SUFFIX}")}

    def __len__(self) -> int:
        return len(self._names)

    def keep(self, held: Held, *, durable: bool = True) -> None:
        """Write the entry, durably (fsync of the file and of the directory) unless
        `durable` is False: then it outlives the daemon's death, not the machine's."""
        if held.name not in self._names and len(self._names) >= self.limit:
            raise JournalFull(f"the journal {self.directory} holds {self.limit} results")
        temporary = self.directory / f".{held.name}.tmp"
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump(held.to_json(), file)
            if durable:
                file.flush()
                os.fsync(file.fileno())
        os.replace(temporary, self.directory / held.name)
        if durable:
            _sync_directory(self.directory)
        self._names.add(held.name)

    def forget(self, held: Held) -> None:
        """The result is written (or no longer needed): drop its entry, if there is one."""
        if held.name not in self._names:
            return
        with contextlib.suppress(FileNotFoundError):
            (self.directory / held.name).unlink()
        self._names.discard(held.name)

    def load(self, log: EventLog) -> list[Held]:
        """Every entry on disk, oldest first; an unreadable one is logged and set aside."""
        entries = []
        for name in sorted(self._names):
            path = self.directory / name
            try:
                entries.append(Held.from_json(json.loads(path.read_text(encoding="utf-8"))))
            except (OSError, ValueError, KeyError, TypeError) as error:
                log.error("unreadable journal entry set aside", path=path, error=error)
                with contextlib.suppress(OSError):
                    path.rename(path.with_suffix(".unreadable"))
                self._names.discard(name)
        return sorted(entries, key=lambda held: held.since)


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
        for held in self.journal.load(self.log):
            self._keep(held, delay=0.0)
        return list(self.by_key.values())

    def hold(self, held: Held) -> None:
        """Keep a result on disk, and try it again soon; one held already failed again:
        try it later, twice as late."""
        if held.key in self.by_key:
            _, delay = self._retry[held.key]
            self._retry[held.key] = (time.monotonic() + delay, min(2 * delay, RETRY_MAX))
            return
        self.counts["results_held"] += 1
        try:
            self.journal.keep(held)
        except (OSError, JournalFull) as error:
            self.counts["journal_errors"] += 1
            self.log.error("result held in memory only", job=held.job_id, step=held.step,
                           epoch=held.epoch, error=error)
        else:
            self.log.warning("result held until the server takes it", job=held.job_id,
                             step=held.step, epoch=held.epoch)
        self._keep(held, delay=RETRY_FIRST)

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


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
