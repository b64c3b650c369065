"""The keep-alive re-saver (thesis 5.2), kept as a backstop.

CouchDB tells a site about a document only when it changes: a job that reached
every site while all their workers were busy would be forgotten, so its creator
re-saves it and the other sites' feeds show it again. The managers' backlogs and
`claimable` scans make it rarely needed; it remains for sites that missed a change
(a feed gap, a replication that was down).

Rules (core.keepalive): only the creator, only open steps, only documents unchanged
for `stale_after` seconds, only unconflicted ones, and the re-save changes nothing
but `keepalive_at`. In line order (core.claim_rank), and only as many as there are
free workers for (core.resave_picks): re-saving a job that waits in a long line
reminds nobody able to run it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from . import core
from .clock import later, utc_now
from .couch import CouchError, Database, Saved
from .design import DDOC
from .periodic import Periodic


class KeepAlive(Periodic):
    what = "keep-alive pass"

    def __init__(self, db: Database, site: str, period: float, stale_after: float,
                 stop: threading.Event, room: Callable[[], Mapping[str, int | None]]) -> None:
        super().__init__("keepalive", site, stop, "jobdist.keepalive")
        self.db = db
        self.period = period
        self.stale_after = stale_after
        self.room = room  # every known site's free workers, as the manager last knew them
        self.resaved = 0
        self.left_for_room = 0  # stale open jobs the last pass left in line: no free worker

    def wait_before_pass(self) -> float:
        return self.period

    def pass_once(self) -> int:
        """Re-save the stale open jobs this site created; how many were re-saved."""
        cutoff = later(utc_now(), -self.stale_after)
        rows = self.db.view(DDOC, "stale_open", startkey=[self.site],
                            endkey=[self.site, cutoff])
        rows.sort(key=row_rank)
        picks = core.resave_picks([(row["id"], row_target(row)) for row in rows], self.room())
        self.left_for_room = len(rows) - len(picks)
        count = 0
        for job_id in picks:
            if self.stop_event.is_set():
                break
            try:
                count += self.resave(job_id)
            except CouchError as error:  # this job only (refused, unreadable): the rest go on
                self.log.warning("keep-alive re-save failed", job=job_id, error=error)
        self.resaved += count
        return count

    def resave(self, job_id: str) -> bool:
        leaves = self.db.leaves(job_id)
        ctx = core.Context(self.site, utc_now())
        touched = core.keepalive(leaves, ctx, self.stale_after) if leaves else None
        if touched is None or not isinstance(self.db.save(touched), Saved):
            return False
        self.log.info("keep-alive re-save", job=job_id, step=touched["step"])
        return True


def row_rank(row: dict[str, object]) -> int:
    """Where a `stale_open` row's job stands in line (core.claim_rank); a document
    written around validation may hold anything in those fields."""
    value = row.get("value")
    fields = value if isinstance(value, dict) else {}
    return core.claim_rank(fields.get("priority"), fields.get("created_at"))


def row_target(row: dict[str, object]) -> object:
    """The current step's target a `stale_open` row carries (None if it carries none:
    resave_picks passes such a row by)."""
    value = row.get("value")
    return value.get("target") if isinstance(value, dict) else None
