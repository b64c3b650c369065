"""The work manager: the single owner of a site's decisions, taken in rounds.

A round gathers what needs deciding, in a fixed order of priority
(serve_once): what the workers reported, with the next work of each worker a
step end frees, and held results due; then the open steps first in line for free
workers and room (core.claim_rank), and only then what the feed just brought,
so a constant stream of new jobs never overtakes the jobs that waited longest;
then what comes due with time (bookings past their timeout, leases to renew or
revoke, wins queued too long, successions, waiting jobs to wake, starts whose
write was deferred). Each group is carried out in batches by the `Settler`
(settle.py): one read and one write for up to BATCH jobs.

Its parts: the `Mailbox` the listener and the workers fill, the `PlanRunner`
that carries written plans out on this site, the `PeriodicWork` that says which
jobs come due with time, the `WaitingJobs` to wake, the `HeldResults`, the
`Verdicts`, the `RevisionsSeen`, and the worker pool, which the daemon builds.
Beyond the thesis, a freed worker takes the next open step in line from the
backlog of what the feed showed, so no open step waits for the next keep-alive
re-save (the `claimable` view now and then catches what the feed did not show).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, deque
from collections.abc import Container, Iterable, Mapping
from concurrent.futures import Executor
from typing import Any

from . import core, status
from .clock import utc_now
from .config import SiteConfig
from .journal import Held, HeldResults, Journal
from .ledger import Ledger, State
from .listener import Changed
from .logs import EventLog
from .mailbox import Finished, Mailbox, Retried
from .model import FINAL_STATUSES, Doc, Job, Progress, StepKey
from .periodic_work import PeriodicWork
from .plan_runner import PlanRunner
from .revisions_seen import RevisionsSeen
from .settle import BATCH, Either, Settler, Task
from .step_run import StepResult
from .store import JobStore
from .verdicts import Verdicts
from .waiting import WaitingJobs
from .workers import Execution, WorkerPool, kill_orphans

ROOM_SEEN_INTERVAL = 1.0  # seconds between two refreshes of Manager.room_seen


def site_pool(config: SiteConfig, mailbox: Mailbox) -> WorkerPool:
    """The site's worker pool, reporting to `mailbox`: what the daemon gives its manager."""
    return WorkerPool(config.name, config.workers, mailbox.finished, config.commands.allows,
                      progress_dir=config.journal_dir() / "progress")


class Manager:
    def __init__(self, config: SiteConfig, store: JobStore, known_sites: Iterable[str],
                 journal: Journal, pool: WorkerPool | None = None,
                 mailbox: Mailbox | None = None, writer: Executor | None = None) -> None:
        """`pool` reports to `mailbox` (site_pool); without them (tests) the manager
        builds both. With a `writer`, the loop's writes go through it, and the reports
        that come meanwhile are served while a write is in flight (Settler.write)."""
        if (pool is None) != (mailbox is None):
            raise ValueError("a worker pool comes with the mailbox it reports to")
        self.config = config
        self.timings = config.timings
        self.site = config.name
        self.log = EventLog("jobdist.manager", site=self.site)
        self.store = store
        self.known_sites = frozenset(known_sites) | {self.site}
        self.restricted = config.commands.allow is not None  # runs only the commands allowed
        self.mailbox = mailbox if mailbox is not None else Mailbox()
        self.pool = pool if pool is not None else site_pool(config, self.mailbox)
        self.own_revs: deque[str] = deque(maxlen=4096)
        self.counts: Counter[str] = Counter()
        self.verdicts = Verdicts(self.counts, self.log, self.own_revs)
        self.skipped = self.verdicts.skipped
        # The other sites' room (status documents).
        self.board = status.Board(self.site, time.monotonic())
        self.periodic = PeriodicWork(config, store, self.pool, self.board, self.skipped,
                                     self.own_revs, self.log)
        self.journal = journal
        self.ledger = Ledger()  # this site's steps, each in its state
        self.runner = PlanRunner(config, store, self.pool, self.mailbox, self.board,
                                 self.periodic, journal, self.ledger, self.counts, self.log)
        # Results the server did not take yet, kept in the journal until it does.
        self.held = HeldResults(journal, self.counts, self.log)
        for held in self.held.replay():
            self.ledger.unrecorded(held.key, held.worker, held.epoch)
        self.draining = False
        self.stop_event = threading.Event()
        # Waiting jobs we created (model.is_waiting), and how the jobs they wait for ended.
        self.waiting = WaitingJobs(self.site, store, self.skipped, self.verdicts.errors,
                                   self.log)
        self.revisions = RevisionsSeen()  # see Task.known
        self.settler = Settler(self.runner, self.waiting, self.verdicts, self.revisions,
                               self.held, self.context, self.decide_task, writer,
                               self._ends_and_next_work)
        self.later_reports: list[Finished | Retried] = []  # of jobs that were in flight
        # Every known site's room as the loop last saw it (None: not known), read by the
        # keep-alive thread (core.resave_picks): replaced whole, never changed in place.
        self.room_seen: Mapping[str, int | None] = dict.fromkeys(self.known_sites)
        self.room_seen_at = -float("inf")

    @property
    def seq(self) -> object:
        """The last change decided on: opaque (int or CouchDB sequence)."""
        return self.periodic.seq

    # --- the loop: gather, then settle (read, decide, write, launch) ---------------------

    def serve_once(self, timeout: float) -> None:
        self.settler.serving = True  # (its writes may overlap: Settler.write)
        try:
            self._serve_once(timeout)
        finally:
            self.settler.serving = False

    def _serve_once(self, timeout: float) -> None:
        changes = self._next_changes(timeout)
        self.settle([*self._ends_and_next_work(), *self._held_tasks_due()])
        arrivals = self._change_tasks(changes)  # (hears the sites' statuses too)
        # Workers and room just freed go to the open steps first in line (core.claim_rank),
        # and only then to what just arrived: a constant stream of new jobs must not
        # overtake the jobs that have waited longest.
        self.settle([*self._scan_tasks_due(), *self._assign_tasks_due(), *arrivals,
                     *self._decisions(self.settler.retries_due())])  # (a failure lost them)
        if changes:
            self.periodic.seq = changes[-1].seq  # feed order: the checkpoint never goes back
        self.settle([*self._ends_and_next_work(),
                     *self._decisions(key[0] for key in self.runner.expired_bookings()),
                     *self._renewal_tasks_due(), *self._decisions(self.periodic.leases_due()),
                     *self._decisions(self.runner.queued_due(self.timings.queue_hold_max)),
                     *self._decisions(self.periodic.successions_due()),
                     *self._decisions(self.waiting.woken()),
                     *self._decisions(self.periodic.waiting_due())])
        self.runner.unbook_expired()
        self.settle([self.decide_task(doc_id, known=self.revisions.known(doc_id))  # (one batch)
                     for doc_id in self.runner.deferred_due(BATCH)])
        self.settle([*self._ends_and_next_work(), *self._scan_tasks_due(),
                     *self._assign_tasks_due()])
        self.periodic.publish_status_if_due(self.own_status())
        self.periodic.checkpoint_if_due()
        self._note_room()

    def _next_changes(self, timeout: float) -> list[Changed]:
        timeout = self.periodic.status_wait(self.own_status(), timeout)
        if self.later_reports:
            timeout = 0.0
        return self.mailbox.next_changes(
            self.runner.wait_at_most(self.waiting.wait_at_most(timeout)), BATCH)

    def _decisions(self, doc_ids: Iterable[str]) -> list[Task]:
        return [self.decide_task(doc_id) for doc_id in doc_ids]

    def _scan_tasks_due(self) -> list[Task]:
        """Free workers go to the wins queued here first (they cost no hop), then to the
        open steps in line, decided on the revision the backlog kept when it has one
        (a claim most often waits: a read each, for every freed worker, cost the
        sites that do not create a request a step)."""
        queued = self._queued_win_tasks()
        taken = {task.doc_id for task in queued}
        open_steps = self.periodic.claimable_due(self.runner.free_workers, self.draining,
                                                 self.runner.idle_for)
        kept = self.periodic.backlog.kept  # as the feed last showed them: no read
        return [*queued, *(self.decide_task(doc_id, known=kept.get(doc_id))
                           for doc_id in open_steps if doc_id not in taken)]

    def _queued_win_tasks(self, freeing: int = 0, busy: Container[str] = ()) -> list[Task]:
        """The wins queued longest, one for each free worker and each `freeing`, decided on
        the revision kept with them (no read; a 409 says it changed); none of `busy`."""
        if self.draining:
            return []
        count = len(self.runner.free_workers()) + freeing
        return [self.decide_task(doc_id, known=self.revisions.known(doc_id))
                for doc_id in self.runner.queued_first(count) if doc_id not in busy]

    def _ends_and_next_work(self, busy: Container[str] = ()) -> list[Task]:
        """What the workers reported, and the next work of each worker a step end frees,
        in the same batch, so in the same write as the ends: the wins queued here, then the
        open steps in line whose revision the backlog kept (no read). Each end is planned
        first, with its worker free; a chained next step of the same job takes the worker
        before these. None about the `busy` jobs: their reports wait (later_reports)."""
        reports = self._report_tasks(busy)
        try:
            return [*reports, *self._next_work(reports, busy)]
        except Exception:  # the ends still go: a result dropped would hold its worker for ever
            self.counts["handler_errors"] += 1
            self.log.exception("error while choosing the next work")
            return reports

    def _next_work(self, reports: list[Task], busy: Container[str]) -> list[Task]:
        freeing = sum(task.held is not None for task in reports)
        if not freeing or self.draining:
            return []
        queued = self._queued_win_tasks(freeing, busy)
        taken = {task.doc_id for task in [*reports, *queued]}
        backlog = self.periodic.backlog
        line = backlog.first(freeing, Either(self.skipped, Either(taken, busy)))
        kept = list(itertools.takewhile(backlog.kept.__contains__, line))  # in line order
        return [*queued, *(self.decide_task(doc_id, known=backlog.kept[doc_id])
                           for doc_id in kept)]

    def _held_tasks_due(self) -> list[Task]:
        return [self.record_task(held) for held in self.held.due()]

    def _assign_tasks_due(self) -> list[Task]:
        return [self.decide_task(doc_id, known=doc)
                for doc_id, doc in self.periodic.open_for_room_due()]

    def _renewal_tasks_due(self) -> list[Task]:
        # (A run whose start is deferred renews nothing: its start, written within
        # Timings.start_delay, sets the lease.)
        return [self.renew_task(key, epoch, report) for key, epoch, report
                in self.periodic.renewals_due(self.ledger.runs(but=[State.DEFERRED]))]

    def _change_tasks(self, changes: list[Changed]) -> list[Task]:
        latest: dict[str, Changed] = {}
        for item in changes:
            latest[item.doc_id] = item  # a burst of changes to one doc is one decision
        tasks = self._decisions(self.waiting.waiting_on(
            [item.doc_id for item in latest.values()
             if (item.doc or {}).get("job_status") in FINAL_STATUSES]))
        for item in sorted(latest.values(),
                           key=lambda item: core.doc_place(self.site, item.doc_id, item.doc or {})):
            self.revisions.heard(item.doc_id, item.rev, item.doc)
            if status.is_status_id(item.doc_id):
                self.periodic.hear_status(item.doc)
                continue
            self.skipped.pop(item.doc_id, None)  # a new revision: worth a new look
            if item.doc is not None or item.rev not in self.own_revs:
                # (Our own revision without its document: our write told the backlog,
                # and no read follows to tell it again.)
                self.periodic.saw_job(item.doc_id, item.doc)
            # Our own write needs no decision, unless a conflict came back with it:
            # then it is the creator's to clean up.
            if item.rev not in self.own_revs or (item.doc or {}).get("_conflicts"):
                tasks.append(self.decide_task(item.doc_id, item.doc))
        return tasks

    def _report_tasks(self, busy: Container[str] = ()) -> list[Task]:
        """The workers' reports, those left for later first; those about `busy` jobs
        are left for later. One that cannot be taken is logged, and the others go on."""
        tasks = []
        reports, self.later_reports = [*self.later_reports, *self.mailbox.reports_now()], []
        for report in reports:
            job_id = report.key[0]
            if job_id in busy:
                self.counts["reports_waited"] += 1
                self.later_reports.append(report)
                continue
            try:
                task = self.finish_task(report.execution, report.result) \
                    if isinstance(report, Finished) else self.retry_note_task(report)
            except Exception:
                self.counts["handler_errors"] += 1
                self.log.exception("error while taking a report", job=job_id,
                                   step=report.key[1])
                continue
            if task is not None:
                tasks.append(task)
        return tasks

    # --- tasks: what each kind of decision plans ----------------------------------

    def decide_task(self, doc_id: str, seen: Doc | None = None,
                    known: Doc | None = None) -> Task:
        """Decide about a job until there is nothing more to do right now (Task: `seen`,
        `known`)."""
        def plan(leaves: list[Job], rejected: list[core.Unusable]) -> core.Plan:
            context = self.context(*self.periodic.silences(doc_id, leaves))
            return core.plan(leaves, context, self.pool_view(), rejected)
        return Task(doc_id, plan, seen=seen, known=known, then_decide=True, notes_leaves=True)

    def settle(self, tasks: Iterable[Task]) -> None:
        """Carry tasks out, in batches (Settler)."""
        self.settler.settle(tasks)

    def process(self, doc_id: str, seen: Doc | None = None) -> None:
        """Decide about one job now (see decide_task)."""
        self.settle([self.decide_task(doc_id, seen)])

    def finish_task(self, execution: Execution, result: StepResult) -> Task | None:
        key = execution.key
        running = self.ledger.run(key)
        if running is None or running.epoch != execution.epoch:
            return None
        # (The worker logged the step's end: "step finished".)
        self.log.debug("report taken", job=key[0], step=key[1], epoch=running.epoch,
                       worker=running.worker, ok=result.ok)
        self.ledger.ended(key)
        self.counts["steps_finished" if result.ok else "steps_failed"] += 1
        self.periodic.scan_soon()
        return self.record_task(Held(key[0], key[1], running.epoch, running.worker, result,
                                     time.time(), running.after))

    def record_task(self, held: Held) -> Task:
        """Record what an execution did; only a current execution advances the job."""
        def plan(leaves: list[Job], rejected: list[core.Unusable]) -> core.Plan:
            # The worker is free now: the core may chain the next step onto it.
            return core.plan_finish(leaves, self.context(), self.pool_view(held.key), held.key,
                                    held.epoch, held.worker, held.result, after=held.after)
        return Task(held.job_id, plan, known=self.revisions.known(held.job_id),
                    retry_conflicts=True, then_decide=True, held=held)

    def retry_note_task(self, item: Retried) -> Task:
        def plan(leaves: list[Job], rejected: list[core.Unusable]) -> core.Plan:
            return core.plan_retried(leaves, self.context(), item.key, item.epoch, item.worker,
                                     item.detail, self.ledger.unwritten_run(item.key, item.epoch))
        # A lost event does not matter: the finish still counts.
        return Task(item.key[0], plan, end_on_refusal=False)

    def renew_task(self, key: StepKey, epoch: int, report: Progress | None = None) -> Task:
        """The heartbeat: push our lease forward, so the creator knows we are alive;
        with the step's latest progress `report`, if it has news."""
        def plan(leaves: list[Job], rejected: list[core.Unusable]) -> core.Plan:
            return core.plan_renew(leaves, self.context(), key, epoch,
                                   renew_below=self.timings.renew_below, report=report)
        # Refused: the lease lapses, and the finish will say what happened.
        return Task(key[0], plan, known=self.revisions.known(key[0]), retry_conflicts=True,
                    end_on_refusal=False)

    # --- what the core and the other sites are told ---------------------------------

    def context(self, lease_silence: dict[str, float] | None = None,
                unchanged_for: float = 0.0) -> core.Context:
        now = time.monotonic()
        room, idle = self.board.rooms(now)
        claim_delay = core.claim_delay_for(self.board.sites_live(now))
        return core.Context(self.site, utc_now(), self.known_sites,
                            booking_timeout=self.timings.booking_timeout,
                            lease=self.timings.lease,
                            skew_margin=self.timings.clock_skew_margin,
                            runs=self.config.commands.allows,
                            lease_silence=lease_silence,
                            room=room, idle=idle,
                            assigning=self.periodic.expecting_assignments(now, self.restricted),
                            claim_delay=claim_delay,
                            fed_by=self.board.feeding(now, claim_delay),
                            fed_claim_delay=max(core.FED_CLAIM_DELAY, claim_delay),
                            successors=self.config.succession.successors,
                            silent=self.periodic.silent(now),
                            creator_timeout=self.timings.creator_timeout,
                            unchanged_for=unchanged_for, ended=self.waiting.ended)

    def _note_room(self) -> None:
        """Refresh room_seen, at most every ROOM_SEEN_INTERVAL: the free workers of ours
        and of the sites with a fresh status (less what we gave them since). Free workers,
        not queues: a reminded site claims only with a free worker (core.decide.on_open)."""
        now = time.monotonic()
        if now - self.room_seen_at < ROOM_SEEN_INTERVAL:
            return
        free = 0 if self.draining else len(self.runner.free_workers())
        self.room_seen = {**dict.fromkeys(self.known_sites), **self.board.free_workers(now),
                          self.site: free}
        self.room_seen_at = now

    def pool_view(self, freeing: StepKey | None = None) -> core.PoolView:
        return self.runner.pool_view(self.draining, freeing)

    def own_status(self) -> status.SiteStatus:
        return status.SiteStatus(
            site=self.site, workers=self.config.workers,
            free_workers=0 if self.draining else len(self.runner.free_workers()),
            draining=self.draining,
            assigns=True, restricted=self.restricted, updated_at=utc_now())

    # --- housekeeping ----------------------------------------------------------------

    def recover(self) -> None:
        """Thesis 4.2.2: after a restart, check every promise the documents say we hold.

        First stop what a crashed predecessor left running: the documents say
        those steps run here, and we are about to release and re-run them. Then
        write the results it held: those steps are not to be released.
        """
        orphans = kill_orphans(self.site, self.store.url)
        self.counts["orphans_killed"] += len(orphans)
        self.periodic.hear_all_statuses()
        self.settle(self._held_tasks_due())
        # All ids first: our decisions change the view while we would page through it.
        self.settle([self.decide_task(doc_id) for doc_id in list(self.store.involving(self.site))])
        self.periodic.scan_soon()

    def drain(self, grace: float) -> None:
        """Graceful stop: claim nothing more, let running steps end or stop them, release."""
        self.draining = True
        # Creators assign and queue us nothing more, and get back the wins we hold.
        self.periodic.publish_status_if_due(self.own_status(), force=True)
        self.runner.release_bookings()
        self.settle(self._decisions(self.runner.queued_first()))
        stopped = self.pool.shutdown(grace)
        if stopped:
            self.log.info("stopped running steps", count=len(stopped))
        self.settle(self._report_tasks())
        self.periodic.checkpoint_if_due(force=True)

    def journal_status(self) -> dict[str, Any]:
        """The results held for the server, for /status and /metrics."""
        return self.held.status()
