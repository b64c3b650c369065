"""The keep-alive re-saver (thesis 5.2), kept as a backstop.

CouchDB only tells a site about a document when it changes. A job that
reached every site while all their workers were busy would be forgotten; the
thesis's creator re-saves its unclaimed jobs periodically so that the other
sites' listeners see them again. Our managers also scan the `claimable` view
whenever a worker frees up, so the re-saver is rarely needed; it remains for
sites that missed a change (a feed gap, a replication that was down).

Rules (core.keepalive): only the creator, only open steps, only documents
unchanged for `stale_after` seconds, only unconflicted ones, and the re-save
changes nothing but `keepalive_at`. Highest priority first.
"""

from __future__ import annotations

import threading

from . import core
from .clock import later, utc_now
from .couch import CouchError, Database, Saved
from .design import DDOC
from .periodic import Periodic


class KeepAlive(Periodic):
    what = "keep-alive pass"

    def __init__(self, db: Database, site: str, period: float, stale_after: float,
                 stop: threading.Event) -> None:
        super().__init__("keepalive", site, stop, "jobdist.keepalive")
        self.db = db
        self.period = period
        self.stale_after = stale_after
        self.resaved = 0

    def wait_before_pass(self) -> float:
        return self.period

    def pass_once(self) -> int:
        """Re-save the stale open jobs this site created; how many were re-saved."""
        cutoff = later(utc_now(), -self.stale_after)
        rows = self.db.view(DDOC, "stale_open", startkey=[self.site],
                            endkey=[self.site, cutoff])
        rows.sort(key=row_priority, reverse=True)
        count = 0
        for row in rows:
            if self.stop_event.is_set():
                break
            try:
                count += self.resave(row["id"])
            except CouchError as error:  # this job only (refused, unreadable): the rest go on
                self.log.warning("keep-alive re-save failed", job=row["id"], error=error)
        self.resaved += count
        return count

    def resave(self, job_id: str) -> bool:
        leaves = self.db.leaves(job_id)
        ctx = core.Context(self.site, utc_now())
        touched = core.keepalive(leaves, ctx, self.stale_after) if leaves else None
        if touched is None or not isinstance(self.db.save(touched), Saved):
            return False
        self.log.info("keep-alive re-save", job=job_id)
        return True


def row_priority(row: dict[str, object]) -> int:
    """A row's priority; a document written around validation may hold anything there."""
    value = row.get("value")
    priority = value.get("priority") if isinstance(value, dict) else None
    return priority if isinstance(priority, int) and not isinstance(priority, bool) else 0
