"""The work manager: the single owner of a site's decisions.

One thread takes events from its inbox (documents that changed, executions
that ended or retried), reads the job's live leaves from the local CouchDB,
asks the pure decision core what to do, and carries the plan out: bookings,
the write (on a 409 it re-reads and decides again), then launches. Because it
alone decides, the core's view of the workers is never stale mid-decision.

Beyond the thesis: when a worker frees up, the manager asks the `claimable`
view for open steps this site may run (highest priority, then oldest), so a
job that arrived while every worker was busy is not forgotten until the next
keep-alive re-save.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import core
from .config import SiteConfig
from .couch import Conflict, CouchError, Database, Forbidden, Saved, Undecodable
from .journal import Held, Journal, JournalFull
from .listener import Changed, save_checkpoint
from .model import Doc, is_live, later, utc_now
from .workers import Execution, StepResult, WorkerPool, kill_orphans

log = logging.getLogger("jobdist.manager")

DESIGN = "jobdist"
SCAN_INTERVAL = 2.0  # seconds between claimable scans while workers stay free
CHECKPOINT_INTERVAL = 2.0
MAX_LEASES_SEEN = 100_000  # jobs whose leases we time; the least recently seen go first
MAX_SKIPPED = 10_000  # jobs remembered as not to be acted on until they change
HELD_RETRY_FIRST = 0.1  # seconds before a held result is tried again; doubles each time
HELD_RETRY_MAX = 2.0  # short beside any lease: a result is written soon after the server is back
Found = tuple[list[Doc], list[core.Rejected]]  # a job's usable leaves, and the others


def spread(site: str, doc_id: str) -> int:
    """A per-site order of equally urgent jobs, so sites do not all claim the same ones."""
    return int.from_bytes(hashlib.blake2b(f"{site}/{doc_id}".encode(), digest_size=4).digest())


@dataclass(frozen=True)
class Finished:
    execution: Execution
    result: StepResult


@dataclass(frozen=True)
class Retried:
    key: core.Key
    epoch: int
    worker: str
    detail: str


class Manager:
    def __init__(self, config: SiteConfig, db: Database, known_sites: Iterable[str],
                 journal: Journal) -> None:
        self.config = config
        self.site = config.name
        self.db = db
        self.known_sites = frozenset(known_sites) | {self.site}
        # From the listener; bounded so a burst pushes back on the feed, not on memory.
        self.inbox: queue.Queue[object] = queue.Queue(maxsize=1_000)
        # Workers report here, and are served before any change: a finished step
        # must not wait behind a burst of replicated changes.
        self.reports: queue.Queue[Finished | Retried] = queue.Queue()
        self.wake = threading.Event()  # set by the listener and the workers
        self.pool = WorkerPool(self.site, config.workers, self._on_done, config.allows)
        # Executions whose end is not recorded yet: running, or ended with the result
        # held (below). Both count as running here, so no decision releases them.
        self.executions: dict[core.Key, core.Running] = {}
        # Results the server did not take yet, kept in the journal until it does.
        self.journal = journal
        self.held: dict[core.Key, Held] = {}
        self.held_retry: dict[core.Key, tuple[float, float]] = {}  # key -> (due, delay)
        for held in journal.load():
            self._hold_in_memory(held)
        self.booked_at: dict[core.Key, float] = {}
        self.own_revs: deque[str] = deque(maxlen=4096)
        # Jobs nothing can be done about until a new revision arrives (invalid,
        # unreadable, refused by the server's rules), and why: scans pass them by.
        self.skipped: OrderedDict[str, str] = OrderedDict()
        self.refusals: dict[str, str] = {}  # job -> the server's reason, for the caller
        self.counts: Counter[str] = Counter()
        self.draining = False
        self.stop_event = threading.Event()
        self.seq: object = None
        self.saved_seq: object = None
        self.last_scan = 0.0
        self.scan_due = True
        self.last_checkpoint = time.monotonic()
        self.last_heartbeat = time.monotonic()
        self.last_lease_scan = 0.0
        # When this daemon first saw each live lease (job -> lease_until ->
        # monotonic time): see core.Context.lease_silence.
        self.leases_seen: dict[str, dict[str, float]] = {}

    # --- the loop -------------------------------------------------------------

    def serve_once(self, timeout: float) -> None:
        self.serve_reports()
        self._write_held_if_due()
        batch = self._next_batch(timeout)
        changed: dict[str, Changed] = {}
        for item in batch:
            changed[item.doc_id] = item  # a burst of changes to one doc is one decision
        for item in sorted(changed.values(), key=self._claim_order):
            self.serve_reports()
            self.skipped.pop(item.doc_id, None)  # a new revision: worth a new look
            # Our own write needs no decision, unless a conflict came back with it:
            # then it is the creator's to clean up.
            if item.rev not in self.own_revs or (item.doc or {}).get("_conflicts"):
                self.guarded(self.process, item.doc_id, item.doc)
        if batch:
            self.seq = batch[-1].seq  # feed order: the checkpoint never goes back
        self.serve_reports()
        self._expire_bookings()
        self._heartbeat_if_due()
        self._revoke_expired_leases_if_due()
        self._scan_if_due()
        self._checkpoint_if_due()

    def _next_batch(self, timeout: float) -> list[Changed]:
        if self.inbox.empty() and self.reports.empty():
            self.wake.wait(timeout)
        self.wake.clear()  # anything arriving from now on sets it again
        batch: list[Changed] = []
        while len(batch) < 500:
            try:
                batch.append(self.inbox.get_nowait())  # type: ignore[arg-type]
            except queue.Empty:
                break
        return batch

    def serve_reports(self) -> None:
        while True:
            try:
                report = self.reports.get_nowait()
            except queue.Empty:
                return
            if isinstance(report, Finished):
                self.guarded(self.finish, report.execution, report.result)
            else:
                self.guarded(self.note_retry, report)

    def guarded(self, handler: Any, *args: Any) -> None:
        """One job's trouble is logged and skipped; it never stops the site."""
        try:
            handler(*args)
        except Exception:
            self.counts["handler_errors"] += 1
            log.exception("error while handling site=%s handler=%s args=%r",
                          self.site, handler.__name__, [repr(a)[:120] for a in args])

    # --- deciding -------------------------------------------------------------

    def recover(self) -> None:
        """Thesis 4.2.2: after a restart, check every promise the documents say we hold.

        First stop what a crashed predecessor left running: the documents say
        those steps run here, and we are about to release and re-run them.
        """
        orphans = kill_orphans(self.site, self.db.url)
        self.counts["orphans_killed"] += len(orphans)
        self._write_held_if_due()  # results a predecessor held: before any re-decision
        for row in self.db.iter_view(DESIGN, "involving", key=self.site):
            self.guarded(self.process, row["id"])
        self.scan_due = True

    def process(self, doc_id: str, seen: Doc | None = None) -> None:
        """Decide about one job until there is nothing more to do right now.

        `seen` is the revision the changes feed delivered. It may be older than
        what we did since, so it may only tell us that there is nothing to do
        (the common case, and then no read is needed); any action is decided
        again on a fresh read of all leaves.
        """
        for _ in range(8):
            from_feed = seen is not None and "_conflicts" not in seen
            found = self._valid(doc_id, [seen]) if from_feed else self._leaves(doc_id)
            seen = None
            if found is None:
                return
            leaves, rejected = found
            plan = core.plan(leaves, self.context(self._lease_silence(doc_id, leaves)),
                             self.pool_view(), rejected)
            if plan.action == core.IGNORE:
                self._skip(doc_id, plan.detail)
                return
            if from_feed and plan.action != "none":
                continue
            if plan.action == "none":
                return
            if not self.execute(doc_id, plan):
                self._after_refusal(doc_id, leaves)
                return
        log.warning("no settled decision job=%s site=%s", doc_id, self.site)

    def finish(self, execution: Execution, result: StepResult) -> None:
        key = execution.key
        running = self.executions.get(key)
        if running is None or running.epoch != execution.epoch:
            return
        log.info("step ended job=%s step=%d site=%s worker=%s epoch=%d ok=%s reason=%r",
                 key[0], key[1], self.site, running.worker, running.epoch, result.ok,
                 result.reason)
        self.counts["steps_finished" if result.ok else "steps_failed"] += 1
        self.scan_due = True
        held = Held(key[0], key[1], running.epoch, running.worker, result, time.time())
        if not self.record_end(held):
            self.hold(held)

    def record_end(self, held: Held) -> bool:
        """Write what an execution did; False when it must be tried again later.

        True also when there is nothing left to record it in (the job was
        removed, or the server refuses the job's next revision for good).
        """
        running = self.executions.pop(held.key)  # its worker is free for a chained step
        recorded = self._write_end(held)
        if not recorded:
            self.executions[held.key] = running
        return recorded

    def _write_end(self, held: Held) -> bool:
        job_id = held.job_id
        for _ in range(8):
            try:
                found = self._read(job_id)
            except CouchError as error:
                log.warning("cannot record the end yet job=%s step=%d site=%s epoch=%d "
                            "error=%s", job_id, held.step, self.site, held.epoch, error)
                return False
            if found is None:
                return True
            leaves = found[0]
            plan = core.plan_finish(leaves, self.context(), self.pool_view(), held.key,
                                    held.epoch, held.worker, held.result)
            written = self.execute(job_id, plan)
            if written is None:
                if self._after_refusal(job_id, leaves):
                    return True
                continue  # a conflict, or the write failed: read again
            # What we just wrote is the state (a later conflict comes through the
            # feed): it can say "nothing to do" without another read.
            seen = {**plan.doc, "_rev": written.rev} if plan.doc and written.rev else None
            self.process(job_id, seen)
            return True
        return False

    # --- results the server did not take ------------------------------------------

    def hold(self, held: Held) -> None:
        """Keep a result on disk and try it again until the server takes it.

        Until then the execution still counts as running here: this site does
        not release the step, and its heartbeat keeps renewing the lease.
        """
        try:
            self.journal.keep(held)
        except (OSError, JournalFull) as error:
            self.counts["journal_errors"] += 1
            log.error("result held in memory only job=%s step=%d site=%s epoch=%d error=%s",
                      held.job_id, held.step, self.site, held.epoch, error)
        self.counts["results_held"] += 1
        log.warning("result held until the server takes it job=%s step=%d site=%s epoch=%d",
                    held.job_id, held.step, self.site, held.epoch)
        self._hold_in_memory(held, delay=HELD_RETRY_FIRST)

    def _hold_in_memory(self, held: Held, delay: float = 0.0) -> None:
        self.held[held.key] = held
        self.executions[held.key] = core.Running(held.worker, held.epoch)
        self.held_retry[held.key] = (time.monotonic() + delay, max(delay, HELD_RETRY_FIRST))

    def _write_held_if_due(self) -> None:
        for key, held in list(self.held.items()):
            due, delay = self.held_retry[key]
            if time.monotonic() < due:
                continue
            if not self.record_end(held):
                self.held_retry[key] = (time.monotonic() + delay, min(2 * delay, HELD_RETRY_MAX))
                continue
            del self.held[key], self.held_retry[key]
            self.journal.forget(held)
            self.counts["results_replayed"] += 1
            log.info("held result written job=%s step=%d site=%s epoch=%d held_for=%.1fs",
                     held.job_id, held.step, self.site, held.epoch, time.time() - held.since)

    def note_retry(self, item: Retried) -> None:
        found = self._leaves(item.key[0])
        if found is not None:
            self.execute(item.key[0], core.plan_event(
                found[0], self.context(), item.key, item.epoch, item.worker, "retried",
                item.detail))
            self.refusals.pop(item.key[0], None)  # a lost event: the finish still counts

    def _leaves(self, doc_id: str) -> Found | None:
        """The job's usable leaves and the others, or None when there is nothing to decide on."""
        try:
            return self._read(doc_id)
        except CouchError as error:
            log.warning("cannot read job=%s site=%s error=%s", doc_id, self.site, error)
            return None

    def _read(self, doc_id: str) -> Found | None:
        """As _leaves, but a server that does not answer raises CouchError."""
        try:
            leaves = self.db.leaves(doc_id)
        except (Undecodable, RecursionError, ValueError) as error:
            # Nested too deeply for Python's JSON parser, or an id no URL can hold:
            # no revision of it will ever be readable here.
            self.counts["invalid_documents"] += 1
            self._skip(doc_id, f"cannot decode: {type(error).__name__}: {str(error)[:200]}")
            return None
        return self._valid(doc_id, leaves)

    def _valid(self, doc_id: str, leaves: list[Doc]) -> Found | None:
        jobs = [leaf for leaf in leaves if leaf.get("type") == "job" and not leaf.get("_deleted")]
        usable, rejected = core.usable_leaves(jobs)
        for rev, reason in rejected:
            self._report_invalid(doc_id, rev, reason)
        if not usable:
            if jobs:  # not a deletion: a job nothing can be done about as it stands
                self._skip(doc_id, "no valid revision")
            return None
        return usable, rejected

    def _report_invalid(self, doc_id: str, rev: str, reason: str) -> None:
        if rev in self.own_revs:
            return
        self.own_revs.append(rev)  # report each bad revision once
        self.counts["invalid_documents"] += 1
        log.error("invalid job skipped job=%s rev=%s site=%s errors=%r",
                  doc_id, rev, self.site, reason)

    def _skip(self, doc_id: str, reason: str) -> None:
        """Leave the job alone until a new revision of it arrives on the feed."""
        if doc_id not in self.skipped:
            log.warning("job skipped until it changes job=%s site=%s reason=%r",
                        doc_id, self.site, reason)
            self.counts["jobs_skipped"] += 1
        self.skipped[doc_id] = reason
        self.skipped.move_to_end(doc_id)
        while len(self.skipped) > MAX_SKIPPED:
            self.skipped.popitem(last=False)

    def _after_refusal(self, doc_id: str, leaves: list[Doc]) -> bool:
        """After a write the server refused for good: end the job if we may, else skip it.

        False when the write was not refused (a conflict: decide again).
        """
        reason = self.refusals.pop(doc_id, None)
        if reason is None:
            return False
        plan = core.plan_refused(leaves, self.context(), reason)
        if not (plan.writes and self.execute(doc_id, plan)):
            self.refusals.pop(doc_id, None)
            self._skip(doc_id, f"write refused: {reason}")
        return True

    def _lease_silence(self, doc_id: str, leaves: list[Doc]) -> dict[str, float]:
        """Note the job's current leases; how long each has been seen unchanged.

        Every site notes them (a site may become the creator by adoption); only
        the creator acts on them. A job whose step holds no lease is forgotten.
        """
        now = time.monotonic()
        before = self.leases_seen.pop(doc_id, {})
        seen = {lease: before.get(lease, now) for leaf in leaves if is_live(leaf)
                and (lease := leaf["job"][leaf["step"]].get("lease_until"))}
        if seen:
            self.leases_seen[doc_id] = seen  # re-inserted: the dict stays oldest first
        while len(self.leases_seen) > MAX_LEASES_SEEN:  # forgetting only delays a revocation
            del self.leases_seen[next(iter(self.leases_seen))]
        return {lease: now - since for lease, since in seen.items()}

    def context(self, lease_silence: dict[str, float] | None = None) -> core.Context:
        return core.Context(self.site, utc_now(), self.known_sites,
                            booking_timeout=self.config.booking_timeout,
                            lease=self.config.lease, skew_margin=self.config.clock_skew_margin,
                            runs=self.config.allows,
                            lease_silence=lease_silence)

    def pool_view(self) -> core.PoolView:
        if self.draining:
            return core.PoolView(running=dict(self.executions))
        now = time.monotonic()
        return core.PoolView(
            free_workers=self.free_workers(),
            booked={key: core.Booking(worker, now - self.booked_at.get(key, now))
                    for key, worker in self.pool.bookings().items()},
            running=dict(self.executions),
        )

    def free_workers(self) -> tuple[str, ...]:
        # A worker whose result we have not recorded yet is not free for new work.
        unreported = {running.worker for running in self.executions.values()}
        return tuple(w for w in self.pool.free_workers() if w not in unreported)

    # --- carrying out a plan --------------------------------------------------------

    def execute(self, doc_id: str, plan: core.Plan) -> Saved | None:
        """Carry a plan out; the saved revision, or None when it must be re-decided."""
        for effect in plan.before:
            self.apply(effect)
        saved = self.write(doc_id, plan)
        if saved is None:
            return None
        self.counts[f"action_{plan.action}"] += 1
        if plan.detail.startswith(core.WON_CLAIM):
            self.counts["claims_won"] += 1
        log.info("%s job=%s site=%s rev=%s%s", plan.action, doc_id, self.site, saved.rev,
                 f" detail={plan.detail!r}" if plan.detail else "")
        for effect in plan.after:
            self.apply(effect, plan.doc)
        return saved

    def write(self, doc_id: str, plan: core.Plan) -> Saved | None:
        """The new revision first, then the losers: never delete progress we failed to keep."""
        saved = Saved(doc_id, "")
        try:
            if plan.doc is not None:
                result = self.db.save(plan.doc)
                if isinstance(result, Conflict):
                    self.counts["write_conflicts"] += 1
                    return None
                saved = result
                self.own_revs.append(saved.rev)
            if plan.deletions:
                self.db.bulk_docs([{"_id": doc_id, "_rev": rev, "_deleted": True}
                                   for rev in plan.deletions])
                self.counts["conflicts_resolved"] += len(plan.deletions)
        except CouchError as error:
            if isinstance(error, Forbidden) and error.status == 403:  # not a 401: a login
                self._refused(doc_id, plan, error)
            else:
                log.warning("write failed job=%s site=%s action=%s error=%s",
                            doc_id, self.site, plan.action, error)
            return None
        return saved

    def _refused(self, doc_id: str, plan: core.Plan, error: Forbidden) -> None:
        """The server's rules refuse the revision: the same write can never succeed."""
        self.counts["writes_refused"] += 1
        log.error("write refused job=%s site=%s action=%s error=%s",
                  doc_id, self.site, plan.action, error)
        for effect in plan.before:  # a worker booked for a write that never happens is lost
            if isinstance(effect, core.Book):
                self.apply(core.Unbook(effect.key))
        self.refusals[doc_id] = error.reason or str(error)

    def apply(self, effect: core.Effect, doc: Doc | None = None) -> None:
        if isinstance(effect, core.Book):
            if self.pool.book(effect.key) is not None:
                self.booked_at.setdefault(effect.key, time.monotonic())
        elif isinstance(effect, core.Unbook):
            self.pool.unbook(effect.key)
            self.booked_at.pop(effect.key, None)
            self.scan_due = True  # a lost claim: look for other work at once
        elif isinstance(effect, core.Kill):
            log.info("killing job=%s step=%d site=%s reason=%r",
                     effect.key[0], effect.key[1], self.site, effect.reason)
            self.pool.cancel(effect.key)
        elif isinstance(effect, core.Launch):
            assert doc is not None
            self.launch(effect, doc)

    def launch(self, effect: core.Launch, doc: Doc) -> None:
        job_id, index = effect.key
        if effect.key in self.executions:  # the core never asks this; never run a step twice
            log.error("not launching a step already running here job=%s step=%d site=%s",
                      job_id, index, self.site)
            return
        env = {
            "JOBDIST_JOB_ID": job_id,
            "JOBDIST_STEP": str(index),
            "JOBDIST_SITE": self.site,
            "JOBDIST_EPOCH": str(effect.epoch),
            "JOBDIST_COUCH": self.db.url,  # with JOBDIST_SITE: finds orphans after a crash
        }
        self.booked_at.pop(effect.key, None)
        execution = self.pool.start(effect.key, effect.epoch, doc["job"][index], env,
                                    on_retry=self._retry_reporter(effect))
        self.executions[effect.key] = core.Running(execution.worker, effect.epoch)
        self.counts["steps_started"] += 1

    def _retry_reporter(self, effect: core.Launch) -> Any:
        def report(attempt: int, detail: str) -> None:
            self.reports.put(Retried(effect.key, effect.epoch, effect.worker,
                                     f"attempt {attempt}: {detail}"))
            self.wake.set()
        return report

    def _on_done(self, execution: Execution, result: StepResult) -> None:
        # Called from the worker's thread: hand over, decide in the manager's.
        self.reports.put(Finished(execution, result))
        self.wake.set()

    # --- housekeeping ----------------------------------------------------------------

    def _expire_bookings(self) -> None:
        now = time.monotonic()
        for key, since in list(self.booked_at.items()):
            if now - since >= self.config.booking_timeout:
                self.guarded(self.process, key[0])
                if self.pool.is_booked(key):  # the document no longer exists
                    self.apply(core.Unbook(key))

    def _heartbeat_if_due(self) -> None:
        """Renew the lease of every step we run, so the creator knows we are alive."""
        now = time.monotonic()
        if now - self.last_heartbeat < self.config.heartbeat:
            return
        self.last_heartbeat = now
        for key, running in list(self.executions.items()):
            self.guarded(self.renew, key, running.epoch)

    def renew(self, key: core.Key, epoch: int) -> None:
        for _ in range(3):
            found = self._leaves(key[0])
            if found is None:
                return
            plan = core.plan_renew(found[0], self.context(), key, epoch,
                                   renew_below=self.config.lease - self.config.heartbeat)
            if plan.action == "none" or self.execute(key[0], plan) is not None:
                return
            if self.refusals.pop(key[0], None) is not None:
                return  # the lease lapses; the finish will say what happened

    def _revoke_expired_leases_if_due(self) -> None:
        """As creator: take back steps whose winner stopped renewing its lease."""
        now = time.monotonic()
        if now - self.last_lease_scan < self.config.heartbeat / 2:
            return
        self.last_lease_scan = now
        cutoff = later(utc_now(), -self.config.clock_skew_margin)
        try:
            rows = self.db.view(DESIGN, "leases", startkey=[self.site],
                                endkey=[self.site, cutoff])
        except CouchError as error:
            log.warning("lease scan failed site=%s error=%s", self.site, error)
            self.leases_seen.clear()  # renewals go unseen meanwhile: count afresh after
            return
        for row in rows:
            if row["id"] not in self.skipped:
                self.guarded(self.process, row["id"])

    def _scan_if_due(self) -> None:
        """Claim open steps that arrived while every worker was busy."""
        if self.draining or not self.free_workers():
            return
        now = time.monotonic()
        if not self.scan_due and now - self.last_scan < SCAN_INTERVAL:
            return
        self.last_scan, self.scan_due = now, False
        for doc_id in self.claimable(limit=4 * len(self.free_workers())):
            if not self.free_workers():
                return
            self.guarded(self.process, doc_id)

    def claimable(self, limit: int) -> list[str]:
        """Open steps this site may run: highest priority first, then oldest."""
        rows = []
        # Skipped jobs may sort first (a hostile priority): read past them, or they
        # would fill the window on every scan and starve everything behind them.
        extra = min(len(self.skipped), 1000)
        try:
            for target in (self.site, "any"):
                rows += self.db.view(DESIGN, "claimable", startkey=[target],
                                     endkey=[target, {}], limit=limit + extra)
        except CouchError as error:
            log.warning("claimable scan failed site=%s error=%s", self.site, error)
            return []
        rows = [row for row in rows if row["id"] not in self.skipped]
        rows.sort(key=lambda row: (row["key"][1], row["key"][2]))
        window = list(dict.fromkeys(row["id"] for row in rows))[:limit]
        priority = {row["id"]: row["key"][1] for row in rows}
        return sorted(window, key=lambda doc_id: (priority[doc_id], spread(self.site, doc_id)))

    def _claim_order(self, item: Changed) -> tuple[int, int]:
        priority = (item.doc or {}).get("priority", 0)
        return (-priority if isinstance(priority, int) else 0, spread(self.site, item.doc_id))

    def _checkpoint_if_due(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.seq is None or self.seq == self.saved_seq:
            return
        if not force and now - self.last_checkpoint < CHECKPOINT_INTERVAL:
            return
        try:
            save_checkpoint(self.db, self.site, self.seq)
            self.saved_seq, self.last_checkpoint = self.seq, now
        except CouchError as error:
            log.warning("checkpoint not saved site=%s error=%s", self.site, error)

    def drain(self, grace: float) -> None:
        """Graceful stop: claim nothing more, let running steps end or stop them, release."""
        self.draining = True
        for key in list(self.pool.bookings()):
            self.apply(core.Unbook(key))
        stopped = self.pool.shutdown(grace)
        if stopped:
            log.info("stopped %d running steps site=%s", len(stopped), self.site)
        self.serve_reports()
        self._checkpoint_if_due(force=True)

    def status(self) -> dict[str, Any]:
        return {"site": self.site, "workers": self.pool.snapshot(), "feed_seq": self.seq,
                "counts": dict(self.counts), "journal": self.journal_status()}

    def journal_status(self) -> dict[str, Any]:
        """The results held for the server, for /status and /metrics."""
        held = list(self.held.values())  # one C-level copy: safe beside the manager thread
        oldest = min((entry.since for entry in held), default=None)
        return {"held": len(held), "on_disk": len(self.journal),
                "oldest_seconds": None if oldest is None else round(time.time() - oldest, 3),
                "directory": str(self.journal.directory)}
