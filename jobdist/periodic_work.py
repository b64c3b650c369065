"""The work manager's periodic work: what comes due with time rather than with a change.

Each `..._due` method answers the jobs to decide about now ([] when it is not time
yet), and the manager decides them in its rounds: open steps for our free workers
and for sites with room, leases to renew or revoke, jobs of silent creators of our
succession lines, our waiting jobs. Also here: our status document, the feed
checkpoint, and how long this site has seen each lease, and each job of our lines,
unchanged (core.Context's lease_silence and unchanged_for), by our own clock.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable

from . import core, status
from .backlog import Backlog, Place
from .clock import later, utc_now
from .config import SiteConfig
from .couch import CouchError, Saved
from .logs import EventLog
from .memo import remember
from .model import Doc, Job, Leaf, Progress, StepKey, is_live
from .store import JobStore, Open
from .workers import WorkerPool

SCAN_INTERVAL = 2.0  # seconds between claimable scans while workers stay free
VIEW_SCAN_INTERVAL = 10.0  # seconds between `claimable` view queries while workers are free
# A worker free this long, not one a step's end has just freed, is worth the view's query
# (asked at a step's end, the query held up the next report: docs/performance.md).
NET_SCAN_IDLE = 1.0
# Seconds between two saves of the feed checkpoint: a restart re-reads (and decides
# again, to no effect) at most this much of the feed.
CHECKPOINT_INTERVAL = 2.0
PROGRESS_INTERVAL = 3.0  # seconds between two progress writes of one step, at least
# Jobs whose leases (and leaves, in our lines) we time; the least recently seen go first,
# which only delays a revocation or a takeover.
MAX_LEASES_SEEN = 100_000
WAITING_SCAN_INTERVAL = 30.0  # seconds between re-checks of the jobs we created that wait


class PeriodicWork:
    def __init__(self, config: SiteConfig, store: JobStore, pool: WorkerPool,
                 board: status.Board, skipped: OrderedDict[str, str], own_revs: deque[str],
                 log: EventLog) -> None:
        self.timings = config.timings
        self.site = config.name
        self.store = store
        self.pool = pool
        self.board = board  # the other sites' room (status documents)
        self.skipped = skipped  # the manager's: jobs no scan brings back until they change
        self.own_revs = own_revs
        self.log = log
        self.last_scan = 0.0
        self.scan_due = True
        self.backlog = Backlog(self.site)  # open steps the feed showed us
        self.last_view_scan = -VIEW_SCAN_INTERVAL  # the first scan asks the view
        self.view_cut = True  # the view's last answer may have left open steps out
        self.view_answers = 0
        self.assign_scan_due = False
        # Have we seen a job of ours since the start (whose recovery reads every live
        # one)? A site that creates none has no open step to give others.
        self.creates = False
        self.last_checkpoint = time.monotonic()
        self.last_heartbeat = time.monotonic()
        self.seq: object = None
        self.saved_seq: object = None
        # The progress report last sent for each running step, and when (see renewals_due).
        self.progress_sent: dict[StepKey, tuple[float, Progress]] = {}
        # When this daemon first saw each live lease (job -> lease_until ->
        # monotonic time): see core.Context.lease_silence.
        self.leases_seen: dict[str, dict[str, float]] = {}
        # When to publish our status.
        self.publisher = status.Publisher(self.timings.status_refresh)
        # Jobs of our succession lines: their leaves, and since when we see them so.
        self.jobs_seen: dict[str, tuple[frozenset[str], float]] = {}
        # The sites whose jobs may become ours, or be taken from us, by succession.
        lines = [(creator, *line) for creator, line in config.succession.successors.items()]
        self.line_sites = frozenset(
            name for line in lines if self.site in line for name in line) - {self.site}
        # When each scan (_scan_due) last ran. The start's recovery reads every job of
        # ours: the backlog has the open ones, and silence is counted from the start.
        self.last_scans = {"lease": 0.0, "waiting": 0.0, "open-step": time.monotonic(),
                           "succession": time.monotonic()}

    # --- open steps: for our free workers, and for the other sites' room ------------------

    def saw_job(self, doc_id: str, doc: Leaf | None, whole: bool = True) -> None:
        """The newest revision of a job we looked at (None: unreadable; `whole`: see
        Backlog.saw): is its step open to us (the backlog), does a site hold a step of
        ours unstarted (the board)?"""
        self.backlog.saw(doc_id, doc, whole)
        if doc is not None and doc.get("creator") == self.site:
            self.creates = True
        if self.board.saw_job(doc_id, doc, time.monotonic()):
            self.assign_scan_due = True  # a site's queue has room again

    def scan_soon(self) -> None:
        """A worker may be free for other work now: the next claimable scan is due at once."""
        self.scan_due = True

    def claimable_due(self, free_workers: Callable[[], tuple[str, ...]], draining: bool,
                      idle_for: Callable[[], float] = lambda: math.inf) -> list[str]:
        """Open steps for our free workers, in line order: the backlog's (no request), and
        the `claimable` view's for what the feed never showed us: every VIEW_SCAN_INTERVAL
        once a worker has been free for NET_SCAN_IDLE (`idle_for`), and at most every
        SCAN_INTERVAL while the backlog has none and the view may know of more
        (`view_cut`). After an answer that held every row and left none out, an empty
        backlog is the truth: asking the view each time a worker freed cost a step's
        end two queries (docs/performance.md)."""
        if draining or not free_workers():
            return []
        now = time.monotonic()
        if not self.scan_due and now - self.last_scan < SCAN_INTERVAL:
            return []
        self.last_scan, self.scan_due = now, False
        limit = 4 * len(free_workers())
        line = self.backlog.first(limit, self.skipped)
        since_view = now - self.last_view_scan
        if (not line and self.view_cut and since_view >= SCAN_INTERVAL) \
                or (since_view >= VIEW_SCAN_INTERVAL and idle_for() >= NET_SCAN_IDLE):
            self.last_view_scan = now
            shown, whole = self.claimable(limit)
            chosen = self.in_line(line, shown, limit)
            # Rows the view showed that we leave out are in no backlog: ask again.
            left_out = {row.job_id for row in shown} - set(chosen) - self.backlog.open.keys()
            self.view_cut = not whole or bool(left_out)
            return chosen
        return line

    def claimable(self, limit: int) -> tuple[list[Open], bool]:
        """Open steps this site may run, as the `claimable` view has them, and whether
        that is every one of them (no failure, no answer cut at its limit)."""
        # Skipped jobs may sort first (a hostile priority): read past them, or they
        # would fill the window on every scan and starve everything behind them.
        extra = min(len(self.skipped), 1000)
        try:
            answers = [self.store.claimable(target, limit + extra)
                       for target in (self.site, "any")]
        except CouchError as error:
            self.log.warning("claimable scan failed", error=error)
            return [], False
        # The first answer after the start may be stale (the view is read `update=lazy`)
        # about changes from before our feed's checkpoint, which the feed does not show
        # us again: only a later one, from the index that query brought up to date, may
        # say that nothing was left out.
        self.view_answers += 1
        whole = self.view_answers >= 2 and all(len(rows) < limit + extra for rows in answers)
        return [row for rows in answers for row in rows if row.job_id not in self.skipped], whole

    def in_line(self, line: list[str], shown: list[Open], limit: int) -> list[str]:
        """The first `limit` jobs in this site's line (core.line_place) of the backlog's
        `line` and the view's rows; a row only the view showed counts as another site's
        job (a view row does not name the creator)."""
        def place(row: Open) -> Place:
            return self.backlog.open.get(row.job_id) or core.line_place(
                self.site, row.job_id, row.rank, row.created_at, own=False)
        places = {doc_id: self.backlog.open[doc_id] for doc_id in line} | \
            {row.job_id: place(row) for row in shown}
        return sorted(places, key=places.__getitem__)[:limit]

    def open_for_room_due(self) -> list[tuple[str, Doc | None]]:
        """As creator, when a site has room: our open steps first in line, each with the
        revision to decide on (None: read it). The backlog's, on the revision it kept (a
        view query and a read for every start at a site with a queue were a fifth of the
        creator's time under a burst); the `stale_open` view's too, for our steps that do
        not name us (in no backlog of ours): every SCAN_INTERVAL while the backlog has
        none of ours, else every VIEW_SCAN_INTERVAL. None from a site that has seen no
        job of its own since it started."""
        if not self.assign_scan_due:
            return []
        self.assign_scan_due = False
        room = sum(max(free, 0) for free in self.board.room(time.monotonic()).values())
        if room <= 0 or not self.creates:
            return []
        mine: list[tuple[str, Doc | None]] = [*self.backlog.created_here(2 * room, self.skipped)]
        known = {doc_id for doc_id, _ in mine}
        open_ids = self._scan_due(
            "open-step", VIEW_SCAN_INTERVAL if mine else SCAN_INTERVAL,
            lambda: self.store.open_created(self.site, 2 * room + min(len(self.skipped), 1000)))
        return [*mine, *((doc_id, None) for doc_id in open_ids if doc_id not in known)]

    # --- leases: renewing ours, revoking those past due ------------------------------------

    def renewals_due(self, executions: dict[StepKey, core.Running],
                     ) -> list[tuple[StepKey, int, Progress | None]]:
        """Renew the lease of every step we run, so the creator knows we are alive, and
        write the progress a step reported: at most one write per step every
        PROGRESS_INTERVAL, the lease renewed in it (so a heartbeat then has nothing
        to write), never a write per line. (Step, epoch, progress report or None.)"""
        now = time.monotonic()
        heartbeat = now - self.last_heartbeat >= self.timings.heartbeat
        if heartbeat:
            self.last_heartbeat = now
        for key in self.progress_sent.keys() - executions.keys():
            del self.progress_sent[key]
        due = []
        for key, running in list(executions.items()):
            report = self._progress_due(key, now)
            if heartbeat or report is not None:
                due.append((key, running.epoch, report))
        return due

    def _progress_due(self, key: StepKey, now: float) -> Progress | None:
        """The step's latest progress report, if it is new and the last went out long enough
        ago."""
        report = self.pool.progress_of(key)
        sent_at, sent = self.progress_sent.get(key, (-PROGRESS_INTERVAL, None))
        if report is None or report is sent or now - sent_at < PROGRESS_INTERVAL:
            return None
        self.progress_sent[key] = (now, report)
        return report

    def leases_due(self) -> list[str]:
        """As creator: the jobs whose winner stopped renewing its lease, to take back.
        Renewals go unseen while the scan fails: their silence is counted afresh after."""
        def due() -> list[str]:
            return self.store.leases_due(self.site,
                                         later(utc_now(), -self.timings.clock_skew_margin))
        return self._scan_due("lease", self.timings.lease_scan_interval, due,
                              on_failure=self.leases_seen.clear)

    def silences(self, doc_id: str, leaves: list[Job]) -> tuple[dict[str, float], float]:
        """How long this site has seen each of the job's current leases (a broadcast
        step's, one per site) unchanged, and its leaves as they are (0: first sight, or a
        job no succession line of ours may take over). Pure: note_leaves notes them."""
        now = time.monotonic()
        leases, revs = self._as_noted(doc_id, leaves, now)
        return ({lease: now - since for lease, since in leases.items()},
                0.0 if revs is None else now - revs[1])

    def note_leaves(self, doc_id: str, leaves: list[Job]) -> None:
        """A decision was made on the job's leaves: since when each of its leases, and its
        leaves, are seen as they are now. Every site notes them (a site may become the
        creator by adoption, or a successor); only the creator acts on the leases. A job
        whose step holds no lease, or that no line of ours may take over, is forgotten."""
        leases, revs = self._as_noted(doc_id, leaves, time.monotonic())
        remember(self.leases_seen, doc_id, leases or None, MAX_LEASES_SEEN)
        remember(self.jobs_seen, doc_id, revs, MAX_LEASES_SEEN)

    def _as_noted(self, doc_id: str, leaves: list[Job], now: float,
                  ) -> tuple[dict[str, float], tuple[frozenset[str], float] | None]:
        """The job's entries in leases_seen and jobs_seen once `leaves` are noted."""
        before = self.leases_seen.get(doc_id, {})
        leases = {lease: before.get(lease, now) for leaf in leaves
                  for lease in core.current_leases(leaf)}
        if not any(leaf.get("creator") in self.line_sites and is_live(leaf) for leaf in leaves):
            return leases, None
        revs = frozenset(leaf["_rev"] for leaf in leaves)
        seen = self.jobs_seen.get(doc_id)
        return leases, (revs, seen[1] if seen is not None and seen[0] == revs else now)

    # --- succession: the jobs of silent creators of our lines --------------------------

    def successions_due(self) -> list[str]:
        """The live jobs of silent creators of our lines: the core says whether it is our
        turn to take them over (core.succession.succeeds). We heard nothing while the scan failed:
        silence is counted afresh after."""
        if not self.line_sites:
            return []
        return self._scan_due("succession", self.timings.succession_scan_interval, lambda: [
            doc_id for site in sorted(self.silent(time.monotonic()))
            for doc_id in self.store.involving(site)
        ], on_failure=lambda: self.board.restart_silence(time.monotonic()))

    def silent(self, now: float) -> frozenset[str]:
        """The sites of our succession lines silent for creator_timeout, by our clock."""
        return self.board.silent(self.line_sites, now, self.timings.creator_timeout)

    # --- our waiting jobs ----------------------------------------------------------------

    def waiting_due(self) -> list[str]:
        """Every WAITING_SCAN_INTERVAL, re-check each waiting job we created: catches the
        ends the feed did not bring (a restart, a job that replicated in late)."""
        return self._scan_due("waiting", WAITING_SCAN_INTERVAL,
                              lambda: self.store.waiting(self.site))

    def _scan_due(self, scan: str, interval: float, query: Callable[[], Iterable[str]],
                  on_failure: Callable[[], None] = lambda: None) -> list[str]:
        """The jobs `query` answers, each once and none skipped, if `scan` last ran
        `interval` seconds ago or more; [] when it is not time yet, or when it fails."""
        now = time.monotonic()
        if now - self.last_scans[scan] < interval:
            return []
        self.last_scans[scan] = now
        try:
            ids = list(query())
        except CouchError as error:
            self.log.warning(f"{scan} scan failed", error=error)
            on_failure()
            return []
        return [doc_id for doc_id in dict.fromkeys(ids) if doc_id not in self.skipped]

    # --- site status -------------------------------------------------------------------

    def hear_status(self, doc: Doc | None) -> None:
        if self.board.hear(doc, time.monotonic()):
            self.assign_scan_due = True

    def hear_all_statuses(self) -> None:
        try:
            for doc in self.store.statuses():
                self.hear_status(doc)
        except CouchError as error:  # the feed brings them as they are renewed
            self.log.warning("cannot read site statuses", error=error)

    def expecting_assignments(self, now: float, restricted: bool) -> frozenset[str]:
        """The creators that may assign steps to us: those that assign, unless our last
        status offered neither a free worker nor a queue (draining: claim at once), or
        we have an allow-list (never assigned to). A busy site's queue still takes their
        steps, so a status with no free worker is no reason to claim."""
        published = self.publisher.last
        if restricted or published is None or published.room + published.queue <= 0:
            return frozenset()
        return self.board.assigning(now)

    def publish_status_if_due(self, mine: status.SiteStatus, force: bool = False) -> None:
        now = time.monotonic()
        # While open steps we may run wait (the backlog), our room is news at once.
        if not force and not self.publisher.due(mine, now, urgent=bool(self.backlog.open)):
            return
        doc = mine.as_doc()
        try:
            if self.publisher.rev is None:  # after a start: on top of what we wrote before
                current = self.store.read([doc["_id"]])[doc["_id"]]
                self.publisher.rev = max(current, key=core.couch_order)["_rev"] if current \
                    else ""
            if self.publisher.rev:
                doc["_rev"] = self.publisher.rev
            (result,) = self.store.write([doc])
        except CouchError as error:
            self.publisher.failed(now)
            self.log.warning("status not published", error=error)
            return
        if isinstance(result, Saved):
            self.own_revs.append(result.rev)
            self.publisher.published(mine, result.rev, now)
        else:  # someone wrote it meanwhile (an older daemon of ours): read it next time
            self.publisher.rev = None
            self.publisher.failed(now)
            self.log.warning("status not published", result=result)

    def status_wait(self, mine: status.SiteStatus, timeout: float) -> float:
        """No longer than until our status is to be published (a changed room settled)."""
        now = time.monotonic()
        due = self.publisher.due_at(mine, now, urgent=bool(self.backlog.open))
        return min(timeout, max(0.0, due - now))

    # --- the feed checkpoint ---------------------------------------------------------------

    def checkpoint_if_due(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.seq is None or self.seq == self.saved_seq:
            return
        if not force and now - self.last_checkpoint < CHECKPOINT_INTERVAL:
            return
        try:
            self.store.save_checkpoint(self.site, self.seq)
            self.saved_seq, self.last_checkpoint = self.seq, now
        except CouchError as error:
            self.log.warning("checkpoint not saved", error=error)
