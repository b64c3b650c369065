"""Carrying tasks out in batches: read, decide, write, launch.

A batch is up to BATCH jobs. The settler reads the current leaves of all of
them in one request (none for a job whose newest revision it knows: Task.known),
asks the pure decision core about each, and writes every new revision in one
`_bulk_docs`; then it deletes losing leaves and launches. A 409 sends that one job
back for a fresh read. Each plan books its worker before the next plan is made,
so the core's view of the workers is never stale mid-batch. A result the server
does not take is held (HeldResults) and tried again; a decision is taken again
a moment later.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Container, Iterable
from concurrent import futures
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import cast

from . import core
from .couch import Conflict, CouchError, Rejected, Saved, Undecodable
from .journal import Held, HeldResults
from .ledger import HERE, IN_BATCH, UNWRITTEN
from .model import Doc, Job, normalise
from .plan_runner import PlanRunner, acted_on
from .revisions_seen import RevisionsSeen
from .store import Written
from .verdicts import Found, Verdicts, is_job_leaf
from .waiting import WaitingJobs

RETRY_DECISION = 1.0  # seconds before a decision whose read or write failed is taken again
MAX_RETRIES = 10_000  # such decisions remembered
BATCH = 200  # jobs decided together: one read and one write a round for all of them
MAX_ROUNDS = 8  # fresh reads of one job in one batch before it is left for later
Planner = Callable[[list[Job], list[core.Unusable]], core.Plan]


@dataclass
class Task:
    """One job to decide about in a batch, and how.

    `seen` is a revision that may show there is nothing to do without a read
    (what the feed delivered, or what we just wrote).

    `known` is the newest revision this site knows of the job (RevisionsSeen, or
    the backlog's for an open step): the plan is made on it and written with its
    `_rev`, without a read. A 409 says it was not the newest: the job is read then
    (`retry_conflicts`), or decided again when the feed brings the newer revision.
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
    notes_leaves: bool = False  # a decision: what it saw of the job is noted (_planned)
    recorded: bool = False  # done: written, or nothing is left to write it in

    @property
    def step(self) -> int | None:
        """The step the task is about as far as known without a read, for the log."""
        if self.held is not None:
            return self.held.step
        doc = self.seen or self.known
        return doc.get("step") if doc else None

    def repeats(self, other: Task) -> bool:
        """Is this a plain decision that `other`, deciding about the same job anyway, makes?"""
        return self.held is None and self.then_decide and other.then_decide


class Settler:
    """Carries tasks out for one site's manager (Manager.settle)."""

    def __init__(self, runner: PlanRunner, waiting: WaitingJobs, verdicts: Verdicts,
                 revisions: RevisionsSeen, held: HeldResults,
                 context: Callable[[], core.Context], decide: Callable[..., Task],
                 writer: Executor | None,
                 meanwhile: Callable[[Container[str]], list[Task]]) -> None:
        """`decide(doc_id, seen)` is the task that decides about a job as usual
        (Manager.decide_task); `meanwhile(busy)` the tasks of the reports that came
        while a write goes through the `writer`, none about a busy job (write)."""
        self.site = runner.site
        self.store = runner.store
        self.runner = runner
        self.ledger = runner.ledger
        self.periodic = runner.periodic
        self.waiting = waiting
        self.verdicts = verdicts
        self.revisions = revisions
        self.held = held
        self.counts = runner.counts
        self.log = runner.log
        self.context = context
        self.decide = decide
        self.own_revs: deque[str] = verdicts.reported  # our writes, and bad revisions reported
        self.retry_at: OrderedDict[str, float] = OrderedDict()  # decisions a failure lost
        self.mailbox = runner.mailbox
        self.writer = writer
        self.meanwhile = meanwhile
        self.serving = False  # in the manager's loop (serve_once): its writes may overlap
        self.overlapping = False  # a write is in flight: what is decided now is decided alone
        self.later_jobs: set[str] = set()  # of the settle under way, the jobs of later batches

    def retries_due(self) -> list[str]:
        """The jobs whose decision a failed read or write lost, due again now."""
        now = time.monotonic()
        due = [doc_id for doc_id, at in self.retry_at.items() if at <= now]
        for doc_id in due:
            del self.retry_at[doc_id]
        return due

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
            if not self.overlapping:
                self.later_jobs = {task.doc_id for task in waiting}
            try:
                self._run_batch(batch)
            except Exception:
                self.counts["handler_errors"] += 1
                self.log.exception("error while deciding a batch", jobs=len(batch),
                                   first=",".join(list(batch)[:5]))
                for task in batch.values():
                    if not task.recorded:
                        self._not_recorded(task)

    def _run_batch(self, pending: dict[str, Task]) -> None:
        jobs = set(pending) if self.overlapping else None  # decided beside a write in flight
        for doc_id, task in list(pending.items()):
            if task.held is not None and self.held.before(task.held.key):
                del pending[doc_id]  # a job's results are written in step order
                self._not_recorded(task)
        try:
            self._run_rounds(pending)
        finally:
            self.runner.batch_done(jobs)

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
            self.log.warning("no settled decision", job=doc_id, step=task.step)
            self._not_recorded(task)

    def _settle_from_seen(self, pending: dict[str, Task]) -> None:
        """Drop the tasks whose `seen` revision shows there is nothing to do; the others
        are planned on it (Task.known)."""
        seen_docs = {doc_id: task.seen for doc_id, task in pending.items()
                     if task.seen is not None and not task.seen.get("_conflicts")}
        self.waiting.ended = self.waiting.awaited_ended({doc_id: [doc]
                                                 for doc_id, doc in seen_docs.items()})
        for doc_id, task in list(pending.items()):
            seen, task.seen = task.seen, None
            if seen is None or seen.get("_conflicts"):
                continue
            plan = self._plan_seen(task, seen)
            if plan is None or plan.action == core.Action.NONE:
                del pending[doc_id]
            elif plan.action == core.Action.IGNORE:
                self.verdicts.skip(doc_id, plan.detail)
                del pending[doc_id]
            else:
                task.known = seen  # act on it; a 409 says there is newer, and a read follows

    def _plan_seen(self, task: Task, seen: Doc) -> core.Plan | None:
        """The task's plan on the feed's revision (None: none, invalid, or the core choked).

        A revision of another site's job is planned on first, normalised, and validated
        only when the plan acts: validating every revision, most of them calling for
        nothing here, was 9 % of the daemons' busy time under a burst (2 % now). The
        creator validates first (it reports and skips), and a revision the core chokes
        on takes the checked way, which says what is wrong."""
        if seen.get("creator") == self.site or not is_job_leaf(seen):
            return self._plan_one(task, self.verdicts.usable(task.doc_id, [seen]))
        try:
            plan: core.Plan | None = self._planned(task, [normalise(seen)], [])
        except Exception:
            return self._plan_one(task, self.verdicts.usable(task.doc_id, [seen]))
        if plan is not None and plan.action != core.Action.NONE \
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
        self.waiting.ended = self.waiting.awaited_ended(leaves)
        for doc_id, task in list(pending.items()):
            found = self.verdicts.usable(doc_id, leaves.get(doc_id, []))
            self._update_backlog(doc_id, found)
            if found is not None:
                self.runner.saw_started(doc_id, found[0])
            plan = self._plan_one(task, found)
            if plan is None or plan.action == core.Action.NONE:
                del pending[doc_id]
                self._recorded(task)  # nothing left to record it in, or nothing to do
                if plan is not None and task.held is not None:
                    # Found written (its answer was lost): the job is decided as usual,
                    # as its write's answer would have had it.
                    pending[doc_id] = self.decide(doc_id)
                continue
            if plan.action == core.Action.IGNORE:
                del pending[doc_id]
                self.verdicts.skip(doc_id, plan.detail)
                continue
            self.runner.plan_made(plan, on_newest=self.revisions.is_deepest(plan.doc))
            assert found is not None
            plans[doc_id] = (plan, found[0])
            if plan.action == core.Action.QUEUE and len(found[0]) == 1:
                # The start is made on it.
                self.revisions.keep_newest(doc_id, cast(Doc, found[0][0]),
                                           self.ledger.has(doc_id, HERE))
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
            plan = None if found is None else self._planned(task, *found)
        except Exception:  # a document the core chokes on: logged, the batch goes on
            self.counts["handler_errors"] += 1
            self.log.exception("error while deciding", job=task.doc_id, step=task.step)
        self._note_plan(task, plan)
        return plan

    def _planned(self, task: Task, leaves: list[Job], rejected: list[core.Unusable],
                 ) -> core.Plan:
        """The task's plan, then its first effects, before the next plan is made: the
        worker of the result it records is free to the plans after it (the plan saw it
        so: Manager.record_task), and what a decision saw of the job is noted."""
        plan = task.plan(leaves, rejected)
        if task.held is not None:
            self.ledger.freed(task.held.key)
        if task.notes_leaves:
            self.periodic.note_leaves(task.doc_id, leaves)
            self.waiting.note(task.doc_id, leaves)
        return plan

    def _note_plan(self, task: Task, plan: core.Plan | None) -> None:
        """Tell the runner what was decided about the job (None: nothing)."""
        self.runner.decided(task.doc_id, plan or core.NOTHING)  # a queued win stays so if planned
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
            answers = self.write(docs, plans) if docs else []  # (every start deferred)
            results = {doc["_id"]: result for doc, result in zip(docs, answers, strict=True)}
        except CouchError as error:
            self.log.warning("write failed", jobs=len(docs), error=error)
            for doc_id in plans:
                # Its answer lost, the server may have taken it: what we knew as the job's
                # newest revision may not be. Its next decision reads first.
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
                if not (task.retry_conflicts or self.ledger.has(doc_id, UNWRITTEN)
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
                self.log.exception("error after writing", job=doc_id, step=acted_on(plan)[0])

    def write(self, docs: list[Job], planned: Container[str]) -> list[Written]:
        """The batch's `_bulk_docs`. In the loop, with a writer, the manager does not
        idle while the server answers: each worker report that comes meanwhile is
        decided at once, with the next work of the worker it frees, in a batch of its
        own, written alone. A report about a busy job (one this write is about, one a
        later batch of this settle decides, or one with a launch or a start this batch
        has yet to carry out or write) waits until the settle is done: a job's
        results are written in step order, and its next plan is made on what this write
        says. The batch in flight's bookings and launches count already (plan_made), so
        the reports' plans see the pool as it will be. At most two writes are out at
        once, never about one job."""
        if self.writer is None or not self.serving or self.overlapping:
            return self.store.write(docs)
        busy = Either(planned, self.later_jobs | self.ledger.jobs_in(IN_BATCH))
        answer = self.writer.submit(self.store.write, docs)
        answer.add_done_callback(self.mailbox.answered)
        self.overlapping = True
        try:
            while not self.mailbox.wait_for_answer(answer):
                self._serve_reports_meanwhile(busy)
        finally:
            self.overlapping = False
            futures.wait([answer])  # never a write of ours behind our back
        return answer.result()

    def _serve_reports_meanwhile(self, busy: Container[str]) -> None:
        try:
            tasks = self.meanwhile(busy)
            if tasks:
                self.counts["decided_while_writing"] += len(tasks)
                self.settle(tasks)
        except Exception:  # the write in flight is still to be seen through
            self.counts["handler_errors"] += 1
            self.log.exception("error while deciding beside a write in flight")

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
            self.revisions.keep_newest(task.doc_id, written, self.ledger.has(task.doc_id, HERE))
            self.periodic.saw_job(task.doc_id, written)
        if task.then_decide and written is not None:
            # What we just wrote is the state (a later conflict comes through the
            # feed): it can say "nothing to do" without another read.
            pending[task.doc_id] = self.decide(task.doc_id, written)
        elif task.then_decide and any(isinstance(e, core.Unbook) for e in plan.before):
            # A booking given back: what it waited for may be ours to do now (the
            # creator's own booking freed, a claim of another site to assign).
            pending[task.doc_id] = self.decide(task.doc_id)
        else:
            # (Local effects alone, such as a kill, change nothing until a report
            # or a change says what came of them.)
            del pending[task.doc_id]

    def _start_deferred(self, task: Task, plan: core.Plan, leaf: Job) -> None:
        """A deferred start (PlanRunner.defers): the step's end is planned on the revision
        the start was (no read); to the backlog and the board the job is started (no free
        worker of ours goes for it again)."""
        self._recorded(task)
        self.revisions.keep_newest(task.doc_id, cast(Doc, leaf), self.ledger.has(task.doc_id, HERE))
        if plan.doc is not None:
            self.periodic.saw_job(task.doc_id, plan.doc)

    def _refused(self, task: Task, plan: core.Plan, leaves: list[Job], result: Rejected) -> None:
        """The server refuses the revision: the same write can never succeed."""
        if result.error != "forbidden":  # not the rules: a login, or the server's trouble
            self.log.warning("write failed", job=task.doc_id, step=acted_on(plan)[0],
                             action=plan.action, error=f"{result.error}: {result.reason}")
            self._not_recorded(task)
            return
        self.counts["writes_refused"] += 1
        self.log.error("write refused", job=task.doc_id, step=acted_on(plan)[0],
                       action=plan.action, reason=result.reason)
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

    def _recorded(self, task: Task) -> None:
        """The task's step result is written (or there is nothing left to write it in)."""
        task.recorded = True
        held = task.held
        if held is None:
            return
        self.ledger.recorded(held.key, held.epoch)  # (a job deleted meanwhile: its worker freed)
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
        self.ledger.unrecorded(held.key, held.worker, held.epoch)
        self.held.hold(held)


@dataclass(frozen=True)
class Either:
    """In one container or the other (no copy of either)."""

    first: Container[str]
    second: Container[str]

    def __contains__(self, item: object) -> bool:
        return item in self.first or item in self.second
