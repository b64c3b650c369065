"""Our waiting jobs (model.is_waiting): woken by the feed, a timer and a slow scan, never
polled one by one.

A job we created that waits for other jobs is decided again when one of them
ends (the feed brings the end; the `waiting_on` view names the jobs waiting
on it), one that waits for a time when its time comes (a heap of times, by
our clock), and every job of ours that waits now and then (the manager's
periodic work: ends the feed did not bring). The manager decides; this says
which jobs, and how the jobs they wait for ended (core.Context.ended).
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

from . import core
from .clock import parse_time
from .couch import CouchError, Undecodable
from .logs import EventLog
from .model import FINAL_STATUSES, Doc, Job, Leaf, awaited, is_waiting
from .store import JobStore

MAX_WAITING = 100_000  # waiting jobs remembered; forgetting one only delays it to the scan


class WaitingJobs:
    def __init__(self, site: str, store: JobStore, skipped: Mapping[str, str],
                 errors_of: Callable[[Doc], list[str]], log: EventLog) -> None:
        self.site = site
        self.store = store
        self.skipped = skipped  # the manager's: jobs not to decide about until they change
        self.errors_of = errors_of  # validate_job, remembered (the manager's)
        self.log = log
        # The times our waiting jobs may start (not_before, as seconds since 1970; the
        # job; the time as written), soonest first; and each job's time in the heap.
        self.wake_heap: list[tuple[float, str, str]] = []
        self.wake_due: dict[str, str] = {}
        # The waiting jobs we created, as last decided: while there are none, a job that
        # ends needs no look-up of jobs waiting on it (the scan catches what this misses).
        self.own_waiting: OrderedDict[str, None] = OrderedDict()
        # How the jobs that the batch being decided waits for ended (awaited_ended), for
        # its decisions (core.Context.ended).
        self.ended: dict[str, str] = {}

    def owned(self, leaves: Sequence[Leaf]) -> list[Leaf]:
        """The leaves of a job we created that waits (any leaf naming us: after an
        adoption, the older leaves name the creator before us)."""
        if not any(leaf.get("creator") == self.site for leaf in leaves):
            return []
        return [leaf for leaf in leaves if leaf.get("job_status") is None and is_waiting(leaf)]

    def awaited_ended(self, leaves: dict[str, list[Doc]]) -> dict[str, str]:
        """How the jobs that our waiting jobs in this batch name ended, as our CouchDB
        shows them (the merge of their leaves), read in one request for the batch."""
        ids = sorted({job_id for versions in leaves.values()
                      for leaf in self.owned(versions)
                      for job_id in awaited(leaf) if isinstance(job_id, str)})
        if not ids:
            return {}
        try:
            found = self.store.read(ids)
        except (CouchError, Undecodable, RecursionError) as error:
            # They stay waiting: the next scan (or the feed) tries again.
            self.log.warning("cannot read the jobs waited for", jobs=len(ids), error=error)
            return {}
        ended: dict[str, str] = {}
        for job_id, versions in found.items():
            jobs = [leaf for leaf in versions if leaf.get("type") == "job"
                    and not leaf.get("_deleted")]
            usable, _ = core.usable_leaves(jobs, self.errors_of)
            final = core.merge(usable)["job_status"] if usable else None
            if final in FINAL_STATUSES:
                ended[job_id] = final
        return ended

    def waiting_on(self, ended_ids: list[str]) -> list[str]:
        """Jobs we created that wait for one of these jobs, which just ended: to decide in
        this very batch (the `waiting_on` view: one request for all of them)."""
        if not ended_ids or not self.own_waiting:
            return []
        try:
            waiters = self.store.waiting_on(ended_ids)
        except CouchError as error:  # the periodic scan catches them
            self.log.warning("cannot look up the jobs waiting", jobs=len(ended_ids), error=error)
            return []
        ids = dict.fromkeys(job_id for job_id, creator in waiters if creator == self.site)
        return [job_id for job_id in ids if job_id not in self.skipped]

    def note(self, doc_id: str, leaves: list[Job]) -> None:
        """Keep count of our waiting jobs, and wake one with a time not to start before
        at that time."""
        waiting = self.owned(leaves)
        if not waiting:
            self.own_waiting.pop(doc_id, None)
            return
        self.own_waiting[doc_id] = None
        while len(self.own_waiting) > MAX_WAITING:
            self.own_waiting.popitem(last=False)
        times = [when for leaf in waiting if isinstance(when := leaf.get("not_before"), str)]
        if not times or self.wake_due.get(doc_id) == max(times):
            return
        when = max(times)
        try:
            due = parse_time(when).timestamp()
        except ValueError:  # a malformed time: the core skips the job as invalid
            return
        if due <= time.time():
            return  # its time has come: it waits for jobs now, and the feed wakes it
        self.wake_due[doc_id] = when
        heapq.heappush(self.wake_heap, (due, doc_id, when))
        while len(self.wake_due) > MAX_WAITING:  # forgetting only delays to the scan
            self.wake_due.pop(next(iter(self.wake_due)))

    def wait_at_most(self, timeout: float) -> float:
        """How long the manager may wait for news: no longer than until the next time
        a waiting job may start."""
        if self.wake_heap:
            timeout = min(timeout, max(0.0, self.wake_heap[0][0] - time.time()))
        return timeout

    def woken(self) -> list[str]:
        """The waiting jobs whose time has come, by our clock: their creator's decides."""
        now, due = time.time(), []
        while self.wake_heap and self.wake_heap[0][0] <= now:
            _, doc_id, when = heapq.heappop(self.wake_heap)
            if self.wake_due.get(doc_id) == when:  # else superseded, or forgotten
                del self.wake_due[doc_id]
                due.append(doc_id)
        return due
