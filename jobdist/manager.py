"""The work manager: the single owner of a site's decisions, taken in rounds.

One thread gathers what needs deciding (documents the feed brought, steps
that ended or retried, bookings past their timeout, leases due, open steps
for free workers), reads the current leaves of all those jobs in one
request, asks the pure decision core about each, and writes every new
revision in one `_bulk_docs`; then it deletes losing leaves and launches. A
409 sends that one job back for a fresh read. Each plan books its worker
before the next plan is made, so the core's view of the workers is never
stale mid-batch. Per step that is a few requests shared by the whole batch,
where deciding one job at a time cost a read and a write each.

The manager is the round loop: gather, read, decide, write, launch. Its
parts, each in its own module: the `Mailbox` the listener and the workers
fill (mailbox.py), the `PlanRunner` that carries written plans out on this
site and knows its workers (plan_runner.py), the `PeriodicWork` that says
which jobs come due with time, publishes our status and saves the feed
checkpoint (periodic_work.py), the `WaitingJobs` that says which of our
waiting jobs to wake (waiting.py), and the worker pool, which the daemon builds.

Beyond the thesis: when a worker frees up, the manager takes the next open
steps this site may run (in line: core.claim_rank) from its backlog of what
the feed showed (backlog.py), and asks the `claimable` view now and then for
what the feed did not show (PeriodicWork.claimable_due), so no open step waits
for the next keep-alive re-save.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from . import core, status
from .clock import utc_now
from .config import SiteConfig
from .couch import Conflict, CouchError, Rejected, Saved, Undecodable
from .held_results import HeldResults
from .journal import Held, Journal
from .listener import Changed
from .logs import EventLog
from .mailbox import Finished, Mailbox, Retried
from .model import FINAL_STATUSES, Doc, Job, Progress, StepKey, normalise
from .periodic_work import PeriodicWork
from .plan_runner import PlanRunner
from .revisions_seen import RevisionsSeen
from .store import JobStore
from .verdicts import Found, Verdicts, is_job_leaf
from .waiting import WaitingJobs
from .workers import Execution, StepResult, WorkerPool, kill_orphans

RETRY_DECISION = 1.0  # seconds before a decision whose read or write failed is taken again
MAX_RETRIES = 10_000  # such decisions remembered
BATCH = 200  # jobs decided together: one read and one write a round for all of them
MAX_ROUNDS = 8  # fresh reads of one job in one batch before it is left for later
ROOM_SEEN_INTERVAL = 1.0  # seconds between two refreshes of Manager.room_seen
Planner = Callable[[list[Job], list[core.Unusable]], core.Plan]


@dataclass
class Task:
    """One job to decide about in a batch, and how.

    `seen` is a revision that may show there is nothing to do without a read
    (what the feed delivered, or what we just wrote).

    `known` is the newest revision this site knows of the job: `seen` when it
    calls for an action; for a step that runs here or a win held here, its own
    last write or the feed's since; for an open step, the revision the backlog
    kept. The plan is made on it and written with its `_rev`, without a read. A
    409 says it was not the newest: the job is read then (`retry_conflicts`), or
    decided again when the feed brings the newer revision.
    (A conflicting leaf that arrived unseen is merged by the creator, as one
    that arrives between a read and a write always could be.)
    """

    doc_id: str
    plan: Planner
    seen: Doc | None = None
    known: Doc | None = None
    retry_conflicts: bool = False  # a 409: read again now (else the feed brings the news)
    then_decide: bool = False  # once written, decide about the job as usual
    end_on_refusal: bool = True  # a refused write makes the creator end the job
    held: Held | None = None  # a step's result: kept in the journal until it is written
    recorded: bool = False  # done: written, or nothing is left to write it in

    def repeats(self, other: Task) -> bool:
        """Is this a plain decision that `other`, deciding about the same job anyway, makes?"""
        return self.held is None and self.then_decide and other.then_decide


def site_pool(config: SiteConfig, mailbox: Mailbox) -> WorkerPool:
    """The site's worker pool, reporting to `mailbox`: what the daemon gives its manager."""
    return WorkerPool(config.name, config.workers, mailbox.finished, config.commands.allows,
                      progress_dir=config.journal_dir() / "progress")


class Manager:
    def __init__(self, config: SiteConfig, store: JobStore, known_sites: Iterable[str],
                 journal: Journal, pool: WorkerPool | None = None,
                 mailbox: Mailbox | None = None) -> None:
        """`pool` reports to `mailbox` (site_pool); without them (tests) the manager
        builds both."""
        if (pool is None) != (mailbox is None):
            raise ValueError("a worker pool comes with the mailbox it reports to")
        self.config = config
        self.site = config.name
        self.log = EventLog("jobdist.manager", site=self.site)
        self.store = store
        self.known_sites = frozenset(known_sites) | {self.site}
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
        self.runner = PlanRunner(config, store, self.pool, self.mailbox, self.board,
                                 self.periodic, journal, self.counts, self.log)
        # Results the server did not take yet, kept in the journal until it does.
        self.held = HeldResults(journal, self.counts, self.log)
        for held in self.held.replay():
            self.runner.executions[held.key] = core.Running(held.worker, held.epoch)
        self._ride_replayed()
        self.retry_at: OrderedDict[str, float] = OrderedDict()  # decisions a failure lost
        self.draining = False
        self.stop_event = threading.Event()
        # Waiting jobs we created (model.is_held), and how the jobs they wait for ended,
        # for the batch being decided (core.Context.ended).
        self.waiting = WaitingJobs(self.site, store, self.skipped, self.verdicts.errors,
                                   self.log)
        self.ended: dict[str, str] = {}
        self.revisions = RevisionsSeen()  # see Task.known
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
        changes = self._next_changes(timeout)
        self.settle([*self._ends_and_next_work(), *self._held_tasks_due()])
        arrivals = self._change_tasks(changes)  # (hears the sites' statuses too)
        # Workers and room just freed go to the open steps first in line (core.claim_rank),
        # and only then to what just arrived: a constant stream of new jobs must not
        # overtake the jobs that have waited longest.
        self.settle([*self._scan_tasks_due(), *self._assign_tasks_due(), *arrivals,
                     *self._retry_tasks_due()])
        if changes:
            self.periodic.seq = changes[-1].seq  # feed order: the checkpoint never goes back
        self.settle([*self._ends_and_next_work(), *self._decisions(self.runner.expired_bookings()),
                     *self._renewal_tasks_due(), *self._decisions(self.periodic.leases_due()),
                     *self._decisions(self.runner.queued_due(self.config.daemon.lease / 2)),
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
        return self.mailbox.next_changes(
            self.runner.wait_at_most(self.waiting.wait_at_most(timeout)), BATCH)

    def _decisions(self, doc_ids: Iterable[str]) -> list[Task]:
        return [self.decide_task(doc_id) for doc_id in doc_ids]

    def _scan_tasks_due(self) -> list[Task]:
        """Free workers go to the wins held here first (they cost no hop), then to the
        open steps in line, decided on the revision the backlog kept when it has one
        (a claim most often waits: a read each, for every freed worker, cost the
        sites that do not create a request a step)."""
        held = self._held_win_tasks()
        taken = {task.doc_id for task in held}
        open_steps = self.periodic.claimable_due(self.runner.free_workers, self.draining,
                                                 self.runner.idle_for)
        kept = self.periodic.backlog.kept  # as the feed last showed them: no read
        return [*held, *(self.decide_task(doc_id, known=kept.get(doc_id))
                         for doc_id in open_steps if doc_id not in taken)]

    def _held_win_tasks(self, freeing: int = 0, taken: Container[str] = ()) -> list[Task]:
        """The wins held longest, one for each free worker and each `freeing`, decided on
        the revision that was held (no read; a 409 says it changed); none of `taken`."""
        if self.draining:
            return []
        count = len(self.runner.free_workers()) + freeing
        return [self.decide_task(doc_id, known=self.revisions.known(doc_id))
                for doc_id in self.runner.queued_first(count) if doc_id not in taken]

    def _ends_and_next_work(self) -> list[Task]:
        """What the workers reported, and the next work of each worker a step end frees,
        in the same batch, so in the same write as the ends: the wins held here, then the
        open steps in line whose revision the backlog kept (no read). Each end is planned
        first, with its worker free; a chained next step of the same job takes the worker
        before these."""
        reports = self._report_tasks()
        try:
            return [*reports, *self._next_work(reports)]
        except Exception:  # the ends still go: a result dropped would hold its worker for ever
            self.counts["handler_errors"] += 1
            self.log.exception("error while choosing the next work")
            return reports

    def _next_work(self, reports: list[Task]) -> list[Task]:
        freeing = sum(task.held is not None for task in reports)
        if not freeing or self.draining:
            return []
        reported = {task.doc_id for task in reports}
        held = self._held_win_tasks(freeing, reported)
        taken = reported | {task.doc_id for task in held}
        backlog = self.periodic.backlog
        line = [row.job_id for row in backlog.first(
            freeing, _Either(self.skipped, taken))]
        kept = list(itertools.takewhile(backlog.kept.__contains__, line))  # in line order
        return [*held, *(self.decide_task(doc_id, known=backlog.kept[doc_id]) for doc_id in kept)]

    def _assign_tasks_due(self) -> list[Task]:
        return [self.decide_task(doc_id, known=doc)
                for doc_id, doc in self.periodic.open_for_room_due()]

    def _renewal_tasks_due(self) -> list[Task]:
        # (A run whose start is deferred renews nothing: its start, written within a
        # quarter of the start-by lease, sets the lease.)
        started = {key: running for key, running in self.runner.executions.items()
                   if key not in self.runner.deferred}
        return [self.renew_task(key, epoch, report)
                for key, epoch, report in self.periodic.renewals_due(started)]

    def _change_tasks(self, changes: list[Changed]) -> list[Task]:
        latest: dict[str, Changed] = {}
        for item in changes:
            latest[item.doc_id] = item  # a burst of changes to one doc is one decision
        tasks = self._decisions(self.waiting.waiting_on(
            [item.doc_id for item in latest.values()
             if (item.doc or {}).get("job_status") in FINAL_STATUSES]))
        for item in sorted(latest.values(), key=self._claim_order):
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

    def _report_tasks(self) -> list[Task]:
        """The workers' reports. One that cannot be taken is logged, and the others go on."""
        tasks = []
        for report in self.mailbox.reports_now():
            job_id = report.key[0]
            try:
                task = self.finish_task(report.execution, report.result) \
                    if isinstance(report, Finished) else self.retry_note_task(report)
            except Exception:
                self.counts["handler_errors"] += 1
                self.log.exception("error while taking a report", job=job_id)
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
            context = self.context(self.periodic.lease_silence(doc_id, leaves),
                                   self.periodic.unchanged_for(doc_id, leaves))
            self.waiting.note(doc_id, leaves)
            return core.plan(leaves, context, self.pool_view(), rejected)
        return Task(doc_id, plan, seen=seen, known=known, then_decide=True)

    def process(self, doc_id: str, seen: Doc | None = None) -> None:
        """Decide about one job now (see decide_task)."""
        self.settle([self.decide_task(doc_id, seen)])

    def finish_task(self, execution: Execution, result: StepResult) -> Task | None:
        key = execution.key
        running = self.runner.executions.get(key)
        if running is None or running.epoch != execution.epoch:
            return None
        self.log.info("step ended", job=key[0], step=key[1], epoch=running.epoch,
                      worker=running.worker, ok=result.ok, reason=result.reason)
        self.runner.run_ended(key, running.epoch)
        self.counts["steps_finished" if result.ok else "steps_failed"] += 1
        self.periodic.scan_soon()
        return self.record_task(Held(key[0], key[1], running.epoch, running.worker, result,
                                     time.time(), self.runner.followed.get((key, running.epoch))))

    def record_task(self, held: Held) -> Task:
        """Record what an execution did; only a current execution advances the job."""
        def plan(leaves: list[Job], rejected: list[core.Unusable]) -> core.Plan:
            # The worker is free now: the core may chain the next step onto it.
            self.runner.executions.pop(held.key, None)
            return core.plan_finish(leaves, self.context(), self.pool_view(), held.key,
                                    held.epoch, held.worker, held.result,
                                    chained=(held.key, held.epoch) in self.runner.chained_runs,
                                    after=held.after)
        return Task(held.job_id, plan, known=self.revisions.known(held.job_id),
                    retry_conflicts=True, then_decide=True, held=held)

    def retry_note_task(self, item: Retried) -> Task:
        def plan(leaves: list[Job], rejected: list[core.Unusable]) -> core.Plan:
            return core.plan_event(leaves, self.context(), item.key, item.epoch, item.worker,
                                   "retried", item.detail,
                                   self.runner.unwritten_run(item.key, item.epoch))
        # A lost event does not matter: the finish still counts.
        return Task(item.key[0], plan, end_on_refusal=False)

    def renew_task(self, key: StepKey, epoch: int, report: Progress | None = None) -> Task:
        """The heartbeat: push our lease forward, so the creator knows we are alive;
        with the step's latest progress `report`, if it has news."""
        def plan(leaves: list[Job], rejected: list[core.Unusable]) -> core.Plan:
            daemon = self.config.daemon
            return core.plan_renew(leaves, self.context(), key, epoch,
                                   renew_below=daemon.lease - daemon.heartbeat,
                                   report=report)
        # Refused: the lease lapses, and the finish will say what happened.
        return Task(key[0], plan, known=self.revisions.known(key[0]), retry_conflicts=True,
                    end_on_refusal=False)

    # --- carrying out tasks in batches ---------------------------------------------

    def settle(self, tasks: Iterable[Task]) -> None:
        """Carry tasks out, BATCH jobs at a time; one job's trouble never stops the rest."""
        waiting = list(tasks)
        while waiting:
            batch: dict[str, Task] = {}
            later_tasks = []
            for task in waiting:
                current = batch.get(task.doc_id)
                if current is None and len(batch) < BATCH:
                    batch[task.doc_id] = task
                elif current is None or not task.repeats(current):
                    later_tasks.append(task)  # one task a job in a batch
                elif current.repeats(task) and current.seen is None and task.seen is not None:
                    batch[task.doc_id] = task  # the same decision, on the feed's revision: no read
            waiting = later_tasks
            try:
                self._run_batch(batch)
            except Exception:
                self.counts["handler_errors"] += 1
                self.log.exception("error while deciding a batch", jobs=list(batch)[:5])
                for task in batch.values():
                    if not task.recorded:
                        self._not_recorded(task)

    def _run_batch(self, pending: dict[str, Task]) -> None:
        for doc_id, task in list(pending.items()):
            if task.held is not None and self.held.before(task.held.key):
                del pending[doc_id]  # a job's results are written in step order
                self._not_recorded(task)
        try:
            self._run_rounds(pending)
        finally:
            self.runner.batch_done()

    def _ride_replayed(self) -> None:
        """Replayed from the journal: the run of a step whose step before has its end held
        too was chained onto that end, and neither was written (a start chained onto an
        end is written with it). It rides on the end again (PlanRunner.riding): the end's
        record starts it in its epoch, then its own result is recorded (or its stop)."""
        for key, held in self.held.by_key.items():
            end = self.held.by_key.get((key[0], key[1] - 1))
            if end is not None:
                self.runner.riding[key] = (held, end.epoch)
                self.runner.note_chained(key, held.epoch)

    def _run_rounds(self, pending: dict[str, Task]) -> None:
        for _ in range(MAX_ROUNDS):
            self._settle_from_seen(pending)
            if not pending:
                return
            known = self._known_leaves(pending)
            unknown = [doc_id for doc_id in pending if doc_id not in known]
            leaves = self._read_all(unknown) if unknown else {}
            if leaves is None:
                for task in pending.values():
                    self._not_recorded(task)
                return
            plans = self._plan_all(pending, leaves | known)
            if plans:
                self._write_all(pending, plans)
        for doc_id, task in pending.items():
            self.log.warning("no settled decision", job=doc_id)
            self._not_recorded(task)

    def _settle_from_seen(self, pending: dict[str, Task]) -> None:
        """Drop the tasks whose `seen` revision shows there is nothing to do; the others
        are planned on it (Task.known)."""
        seen_docs = {doc_id: task.seen for doc_id, task in pending.items()
                     if task.seen is not None and not task.seen.get("_conflicts")}
        self.ended = self.waiting.awaited_ended({doc_id: [doc]
                                                 for doc_id, doc in seen_docs.items()})
        for doc_id, task in list(pending.items()):
            seen, task.seen = task.seen, None
            if seen is None or seen.get("_conflicts"):
                continue
            plan = self._plan_seen(task, seen)
            if plan is None or plan.action == "none":
                del pending[doc_id]
            elif plan.action == core.IGNORE:
                self.verdicts.skip(doc_id, plan.detail)
                del pending[doc_id]
            else:
                task.known = seen  # act on it; a 409 says there is newer, and a read follows

    def _plan_seen(self, task: Task, seen: Doc) -> core.Plan | None:
        """The task's plan on the feed's revision (None: none, invalid, or the core choked).

        Validation guards what we act on. Every site validated every revision it saw,
        most of them only to find it had nothing to do (another site's start or end):
        9 % of the daemons' busy time under a burst (2 % now). So a revision of another
        site's job is planned on first, normalised as the checked way would, and
        validated only when the plan acts; for a valid revision that plan is the checked
        way's. The site the revision names as its creator checks, reports and skips it
        first, and a revision the core chokes on takes the checked way, which says
        what is wrong."""
        if seen.get("creator") == self.site or not is_job_leaf(seen):
            return self._plan_one(task, self.verdicts.usable(task.doc_id, [seen]))
        try:
            plan: core.Plan | None = task.plan([normalise(seen)], [])
        except Exception:
            return self._plan_one(task, self.verdicts.usable(task.doc_id, [seen]))
        if plan is not None and plan.action != "none" \
                and self.verdicts.usable(task.doc_id, [seen]) is None:
            plan = None  # invalid: reported and skipped, nothing done
        self._note_plan(task, plan)
        return plan

    def _known_leaves(self, pending: dict[str, Task]) -> dict[str, list[Doc]]:
        """The tasks to plan on the newest revision we know, each once (Task.known)."""
        known = {}
        for doc_id, task in pending.items():
            doc, task.known = task.known, None
            if doc is not None and not doc.get("_conflicts"):
                known[doc_id] = [doc]
        return known

    def _read_all(self, ids: list[str]) -> dict[str, list[Doc]] | None:
        """The jobs' live leaves; None when the server does not answer."""
        try:
            leaves = self.store.read(ids)
            for doc_id, found in leaves.items():
                for leaf in found:
                    self.revisions.saw(doc_id, leaf.get("_rev") or "")
            return leaves
        except (Undecodable, RecursionError):
            # One job nested too deeply for Python's JSON parser spoils the batch:
            # read each alone, and skip the unreadable one.
            return {doc_id: self._read_alone(doc_id) for doc_id in ids}
        except CouchError as error:
            self.log.warning("cannot read jobs", jobs=len(ids), error=error)
            return None

    def _read_alone(self, doc_id: str) -> list[Doc]:
        try:
            return self.store.read([doc_id])[doc_id]
        except (Undecodable, RecursionError) as error:
            self.counts["invalid_documents"] += 1
            self.verdicts.skip(doc_id, f"cannot decode: {type(error).__name__}: {str(error)[:200]}")
            return []

    def _plan_all(self, pending: dict[str, Task],
                  leaves: dict[str, list[Doc]]) -> dict[str, tuple[core.Plan, list[Job]]]:
        """Each job's plan, its worker booked before the next is made."""
        plans = {}
        self.ended = self.waiting.awaited_ended(leaves)
        for doc_id, task in list(pending.items()):
            found = self.verdicts.usable(doc_id, leaves.get(doc_id, []))
            self._update_backlog(doc_id, found)
            if found is not None:
                self.runner.saw_started(doc_id, found[0])
            plan = self._plan_one(task, found)
            if plan is None or plan.action == "none":
                del pending[doc_id]
                self._recorded(task)  # nothing left to record it in, or nothing to do
                continue
            if plan.action == core.IGNORE:
                del pending[doc_id]
                self.verdicts.skip(doc_id, plan.detail)
                continue
            self.runner.plan_made(plan, on_newest=self.revisions.is_deepest(plan.doc))
            assert found is not None
            plans[doc_id] = (plan, found[0])
            if plan.action == core.QUEUED and len(found[0]) == 1:
                # The start is made on it.
                self.revisions.keep_newest(doc_id, cast(Doc, found[0][0]),
                                           self.runner.runs(doc_id))
        return plans

    def _update_backlog(self, doc_id: str, found: Found | None) -> None:
        """A job read: its merged leaves say whether it is open here (a scan of the view
        found it, or the feed showed a conflicted winner)."""
        leaves = found[0] if found is not None else []
        if len(leaves) > 1:
            self.periodic.saw_job(doc_id, core.merge(leaves), whole=False)
        else:
            whole = found is not None and not found[1]  # no invalid leaf for the creator
            self.periodic.saw_job(doc_id, leaves[0] if leaves else None, whole=whole)

    def _plan_one(self, task: Task, found: Found | None) -> core.Plan | None:
        """The task's plan on the job's usable leaves (None: none, or the core choked)."""
        plan = None
        try:
            plan = None if found is None else task.plan(*found)
        except Exception:  # a document the core chokes on: logged, the batch goes on
            self.counts["handler_errors"] += 1
            self.log.exception("error while deciding", job=task.doc_id)
        self._note_plan(task, plan)
        return plan

    def _note_plan(self, task: Task, plan: core.Plan | None) -> None:
        """Tell the runner what was decided about the job (None: nothing)."""
        self.runner.decided(task.doc_id, plan or core.NOTHING)  # a win held stays so if planned
        if task.then_decide and plan is not None:
            self.runner.decided_about(task.doc_id, plan)

    def _write_all(self, pending: dict[str, Task],
                   plans: dict[str, tuple[core.Plan, list[Job]]]) -> None:
        """One `_bulk_docs` for every new revision; then the losers; then launches."""
        for doc_id, (plan, leaves) in list(plans.items()):
            if self.runner.defers(plan, leaves):
                del plans[doc_id]
                self._start_deferred(pending.pop(doc_id), plan, leaves[0])
        docs = [plan.doc for plan, _ in plans.values() if plan.doc is not None]
        try:
            answers = self.store.write(docs) if docs else []  # (every start held back)
            results = {doc["_id"]: result for doc, result in zip(docs, answers, strict=True)}
        except CouchError as error:
            self.log.warning("write failed", jobs=len(docs), error=error)
            for doc_id in plans:
                # Its answer lost, the server may have taken it: what we knew as the job's
                # newest revision may not be. Its next decision reads first (a result
                # decided again on the revision before our own end chained a run onto
                # an end already written, which no revision could then start).
                self.revisions.newest.pop(doc_id, None)
                self._not_recorded(pending.pop(doc_id))
            return
        written = []
        for doc_id, (plan, leaves) in plans.items():
            result = results.get(doc_id, Saved(doc_id, ""))  # none: deletions only
            task = pending[doc_id]
            if isinstance(result, Saved):
                written.append((doc_id, plan, result.rev))
                self._after_write(pending, task, plan, result.rev)
            elif isinstance(result, Conflict):
                self.counts["write_conflicts"] += 1
                self.runner.conflicted(plan)
                if not (task.retry_conflicts or self.runner.launched_ahead(doc_id)
                        or self.runner.booked_by(plan)):
                    del pending[doc_id]  # the conflicting revision comes through the feed
            else:
                del pending[doc_id]
                self._refused(task, plan, leaves, result)
        self.runner.delete_losers(written)
        for doc_id, plan, rev in written:
            try:
                self.runner.carried_out(doc_id, plan, rev)
            except Exception:  # e.g. a launch the pool refuses: the others still go
                self.counts["handler_errors"] += 1
                self.log.exception("error after writing", job=doc_id)

    def _after_write(self, pending: dict[str, Task], task: Task, plan: core.Plan,
                     rev: str) -> None:
        if rev:
            self.own_revs.append(rev)
            self.revisions.saw(task.doc_id, rev)
            # The server took it through validate_doc_update: not judged again when
            # the next decision is made on it.
            self.verdicts.passed(task.doc_id, rev)
        self._recorded(task)
        written = {**plan.doc, "_rev": rev} if plan.doc is not None and rev else None
        if written is not None:
            self.revisions.keep_newest(task.doc_id, written, self.runner.runs(task.doc_id))
            self.periodic.saw_job(task.doc_id, written)
        if task.then_decide and written is not None:
            # What we just wrote is the state (a later conflict comes through the
            # feed): it can say "nothing to do" without another read.
            pending[task.doc_id] = self.decide_task(task.doc_id, written)
        elif task.then_decide and any(isinstance(e, core.Unbook) for e in plan.before):
            # A booking given back: what it waited for may be ours to do now (the
            # creator's own booking freed, a claim of another site to assign).
            pending[task.doc_id] = self.decide_task(task.doc_id)
        else:
            # (Local effects alone, such as a kill, change nothing until a report
            # or a change says what came of them.)
            del pending[task.doc_id]

    def _start_deferred(self, task: Task, plan: core.Plan, leaf: Job) -> None:
        """A start launched ahead, its write held back (PlanRunner.defers): the step's end
        is planned on the revision the start was (no read); to the backlog and the board
        the job is started (no free worker of ours goes for it again)."""
        self._recorded(task)
        self.revisions.keep_newest(task.doc_id, cast(Doc, leaf), self.runner.runs(task.doc_id))
        if plan.doc is not None:
            self.periodic.saw_job(task.doc_id, plan.doc)

    def _refused(self, task: Task, plan: core.Plan, leaves: list[Job], result: Rejected) -> None:
        """The server refuses the revision: the same write can never succeed."""
        if result.error != "forbidden":  # not the rules: a login, or the server's trouble
            self.log.warning("write failed", job=task.doc_id, action=plan.action,
                             error=f"{result.error}: {result.reason}")
            self._not_recorded(task)
            return
        self.counts["writes_refused"] += 1
        self.log.error("write refused", job=task.doc_id, action=plan.action,
                       reason=result.reason)
        self.runner.refused(plan)
        self._recorded(task)  # nothing more can be recorded of it
        if task.end_on_refusal:
            self._end_refused(task.doc_id, leaves, result.reason)

    def _end_refused(self, doc_id: str, leaves: list[Job], reason: str) -> None:
        """The creator ends a job whose next revision is refused; else it is skipped."""
        plan = core.plan_refused(leaves, self.context(), reason)
        if plan.doc is not None:
            try:
                result = self.store.write([plan.doc])[0]
            except CouchError:
                result = None
            if isinstance(result, Saved):
                self.own_revs.append(result.rev)
                self.runner.delete_losers([(doc_id, plan, result.rev)])
                self.runner.carried_out(doc_id, plan, result.rev)
                return
        self.verdicts.skip(doc_id, f"write refused: {reason}")

    # --- results the server did not take ------------------------------------------

    def _recorded(self, task: Task) -> None:
        """The task's step result is written (or there is nothing left to write it in)."""
        task.recorded = True
        held = task.held
        if held is None:
            return
        self.runner.result_recorded(held.key, held.epoch)
        self.held.written(held)

    def _not_recorded(self, task: Task) -> None:
        """The server did not take the task's write: a result is kept, a decision is
        taken again a moment later (no change may come to prompt it)."""
        held = task.held
        if held is None:
            self.runner.defer_again(task.doc_id)
            if task.then_decide:
                self.retry_at[task.doc_id] = time.monotonic() + RETRY_DECISION
                while len(self.retry_at) > MAX_RETRIES:
                    self.retry_at.popitem(last=False)
            return
        self.runner.executions[held.key] = core.Running(held.worker, held.epoch)
        if not self.held.back_off(held.key):
            self.held.hold(held)

    def _retry_tasks_due(self) -> list[Task]:
        now = time.monotonic()
        due = [doc_id for doc_id, at in self.retry_at.items() if at <= now]
        for doc_id in due:
            del self.retry_at[doc_id]
        return [self.decide_task(doc_id) for doc_id in due]

    def _held_tasks_due(self) -> list[Task]:
        return [self.record_task(held) for held in self.held.due()]

    def context(self, lease_silence: dict[str, float] | None = None,
                unchanged_for: float = 0.0) -> core.Context:
        now = time.monotonic()
        room, idle = self.board.rooms(now)
        return core.Context(self.site, utc_now(), self.known_sites,
                            booking_timeout=self.config.daemon.booking_timeout,
                            lease=self.config.daemon.lease,
                            skew_margin=self.config.daemon.clock_skew_margin,
                            runs=self.config.commands.allows,
                            lease_silence=lease_silence,
                            room=room, idle=idle,
                            assigning=self.periodic.expecting_assignments(now, self.restricted),
                            fed_by=self.board.feeding(now, core.CLAIM_DELAY),
                            successors=self.config.succession.successors,
                            silent=self.periodic.silent(now),
                            creator_timeout=self.config.succession.creator_timeout,
                            unchanged_for=unchanged_for, ended=self.ended)

    def _note_room(self) -> None:
        """Refresh room_seen, at most every ROOM_SEEN_INTERVAL: the free workers of ours
        and of the sites with a fresh status (less what we gave them since). Free workers,
        not queues: a reminded site claims only with a free worker (core.on_open)."""
        now = time.monotonic()
        if now - self.room_seen_at < ROOM_SEEN_INTERVAL:
            return
        free = 0 if self.draining else len(self.runner.free_workers())
        self.room_seen = {**dict.fromkeys(self.known_sites), **self.board.free_workers(now),
                          self.site: free}
        self.room_seen_at = now

    def pool_view(self) -> core.PoolView:
        return self.runner.pool_view(self.draining)

    @property
    def restricted(self) -> bool:
        return self.config.commands.allow is not None

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

    def _claim_order(self, item: Changed) -> tuple[int, int, str, int]:
        return core.doc_place(self.site, item.doc_id, item.doc or {})

    def drain(self, grace: float) -> None:
        """Graceful stop: claim nothing more, let running steps end or stop them, release."""
        self.draining = True
        # Creators assign and queue us nothing more, and get back the wins we hold.
        self.periodic.publish_status_if_due(self.own_status(), force=True)
        self.runner.release_bookings()
        self.settle(self._decisions(self.runner.queued_first(len(self.runner.queued))))
        stopped = self.pool.shutdown(grace)
        if stopped:
            self.log.info("stopped running steps", count=len(stopped))
        self.settle(self._report_tasks())
        self.periodic.checkpoint_if_due(force=True)

    def journal_status(self) -> dict[str, Any]:
        """The results held for the server, for /status and /metrics."""
        return self.held.status()


@dataclass(frozen=True)
class _Either:
    """In one container or the other (no copy of either)."""

    first: Container[str]
    second: Container[str]

    def __contains__(self, item: object) -> bool:
        return item in self.first or item in self.second
