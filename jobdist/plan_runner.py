"""Carrying out the manager's plans on this site: the local side of its decisions.

Once a plan's revision is written, the plan runner deletes the losing leaves,
then carries out the plan's effects (bookings, launches, kills, assignments),
and tells the ledger what became of each step. From the ledger and the pool it
derives the view the decision core decides on (`pool_view`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Container

from . import core, status
from .config import SiteConfig
from .couch import CouchError, Saved
from .journal import Held, Journal, JournalFull, unwritten_start
from .ledger import Ledger, State
from .logs import EventLog
from .mailbox import Mailbox
from .model import Job, Reason, StepKey
from .periodic_work import PeriodicWork
from .store import JobStore
from .workers import WorkerPool


class PlanRunner:
    def __init__(self, config: SiteConfig, store: JobStore, pool: WorkerPool, mailbox: Mailbox,
                 board: status.Board, periodic: PeriodicWork, journal: Journal, ledger: Ledger,
                 counts: Counter[str], log: EventLog) -> None:
        self.config = config
        self.timings = config.timings
        self.journal = journal
        self.site = config.name
        self.store = store
        self.pool = pool
        self.mailbox = mailbox
        self.board = board
        self.periodic = periodic
        self.ledger = ledger  # this site's steps, in their states
        self.counts = counts
        self.log = log
        self.start_delay = self.timings.start_delay  # (a property: asked of every start)

    # --- what the core sees of our workers ------------------------------------------

    def pool_view(self, draining: bool, freeing: StepKey | None = None) -> core.PoolView:
        """The view the core decides on; with `freeing`, as if that run's record were gone
        (a result planned: Settler._planned frees it once the plan is made)."""
        ledger = self.ledger if freeing is None else self.ledger.without(freeing)
        running = ledger.running()
        if draining:
            return core.PoolView(running=running)
        now = time.monotonic()
        since = self._free_since(ledger)
        return core.PoolView(
            free_workers=tuple(since),
            idle_for=now - min(since.values(), default=now),
            booked=ledger.bookings(self.pool.bookings(), now),
            running=running,
            queued={key: now - since for key, since in ledger.queued().items()},
            queue_limit=self.config.workers,
            ahead=ledger.ahead(),
        )

    def free_workers(self) -> tuple[str, ...]:
        return tuple(self._free_since(self.ledger))

    def idle_for(self) -> float:
        """How long the worker free longest has been free (0: none is)."""
        since = self._free_since(self.ledger).values()
        return time.monotonic() - min(since) if since else 0.0

    def _free_since(self, ledger: Ledger) -> dict[str, float]:
        """The free workers, in the order the pool books them, and since when each is:
        one whose result is not recorded yet is not free (Ledger.worker_freed)."""
        unreported = {running.worker for running in ledger.runs().values()}
        return {worker: max(at, ledger.worker_freed.get(worker, at))
                for worker, at in self.pool.free_since().items() if worker not in unreported}

    def plan_made(self, plan: core.Plan, on_newest: bool = False) -> None:
        """A plan of the batch, before the write: book its worker, so that the next plan
        is made on the pool as it will be (launches under way count as running); made
        on the newest revision seen, launch its steps ahead of the write."""
        for effect in plan.before:
            self.apply(effect)
        launches = [launch for launch in plan.after if isinstance(launch, core.Launch)]
        for launch in launches:
            self.ledger.launching(launch.key, launch.worker, launch.epoch)
        for launch in launches:
            # (docs/protocol.md, "Launch ahead"; never an execution launched here before)
            if on_newest and plan.doc is not None and launch.ahead \
                    and (launch.key, launch.epoch) not in self.ledger.launched \
                    and self.ledger.run(launch.key) is None:
                self.launch_ahead(launch, plan.doc)

    def launch_ahead(self, launch: core.Launch, doc: Job) -> None:
        """Launch now, the journal entry on disk first (journal.unwritten_start); when
        either fails, the step is launched once its start is written, as any other."""
        entry = unwritten_start(launch.key[0], launch.key[1], launch.epoch, launch.worker,
                                after=core.follows(doc, launch.key[1]))
        try:
            self.journal.keep(entry, durable=False)  # (why: journal.py)
        except (OSError, JournalFull) as error:
            self.log.warning("not launched ahead: the journal cannot keep it",
                             job=launch.key[0], step=launch.key[1], error=error)
            return
        try:
            self.launch(launch, doc)
        except Exception:  # e.g. the pool refuses: tried again once the write is saved
            self.journal.forget(entry)
            self.log.exception("cannot launch ahead", job=launch.key[0], step=launch.key[1])
            return
        self.ledger.launched_ahead(launch.key, entry)

    def defers(self, plan: core.Plan, leaves: list[Job]) -> bool:
        """Hold back the write of a plan that only starts a step launched ahead, on a job
        with one leaf: if the step ends within `start_delay`, its start is written with its
        end (core.plan_finish, late_start), one revision instead of two; else when due
        (deferred_due). Any decision about the job meanwhile writes the start at once
        (core.starts.record_late_start)."""
        if self.start_delay <= 0 or plan.action != core.Action.START or plan.deletions \
                or len(leaves) != 1 or not only_starts(plan.doc, leaves[0]):
            return False
        launches = [effect for effect in plan.after if isinstance(effect, core.Launch)]
        if len(launches) != 1 or len(plan.after) != 1:
            return False
        key = launches[0].key
        if self.ledger.state(key) not in (State.AHEAD, State.DUE) \
                or self.ledger.unwritten_run(key, launches[0].epoch) is None:
            return False
        self.ledger.defer(key, time.monotonic() + self.start_delay)
        self.counts["starts_deferred"] += 1
        self.counts["action_start"] += 1  # carried out: launched
        return True

    def deferred_due(self, limit: int) -> list[str]:
        """The jobs of at most `limit` deferred starts now due: to be written by the batch
        that decides them, or stopped (batch_done)."""
        due = self.ledger.due(time.monotonic(), limit)
        for key in due:
            self.ledger.fall_due(key)
        return [key[0] for key in due]

    def defer_again(self, job_id: str) -> None:
        """The server did not answer the batch that was to write the job's due start: the
        run goes on, its start tried again later, for up to Timings.defer_limit."""
        for key, entry in self.ledger.unwritten([State.DUE], job_id):
            if time.time() - entry.since < self.timings.defer_limit:  # else stopped: batch_done
                self.ledger.defer(key, time.monotonic() + self.start_delay)

    def decided_about(self, job_id: str, plan: core.Plan) -> None:
        """A decision about a job that does not write its deferred start (core.
        record_late_start comes first): the document no longer calls for it (a cancel, a
        revocation, a lapsed win), so the run is stopped with the batch."""
        for key, entry in self.ledger.unwritten([State.DEFERRED], job_id):
            if not core.records_start(plan.doc, key, entry.epoch, self.site):
                self.ledger.fall_due(key)

    def wait_at_most(self, timeout: float) -> float:
        """No longer than until the next deferred start falls due."""
        due = self.ledger.next_due()
        return timeout if due is None else min(timeout, max(0.0, due - time.monotonic()))

    def saw_started(self, doc_id: str, leaves: list[Job]) -> None:
        """The job as read shows a start of ours that is unwritten here: a write the server
        took but never answered. It is written: the run goes on."""
        unwritten = self.ledger.unwritten([State.AHEAD, State.DUE], doc_id)
        if leaves and unwritten:
            self._starts_written(leaves[0] if len(leaves) == 1 else core.merge(leaves),
                                 unwritten)

    def _starts_written(self, doc: Job | None, unwritten: list[tuple[StepKey, Held]]) -> None:
        """The starts `doc` records: their journal entries go, and the runs go on."""
        for key, entry in unwritten:
            if core.records_start(doc, key, entry.epoch, self.site):
                self.journal.forget(entry)
                self.ledger.start_settled(key)

    def decided(self, doc_id: str, plan: core.Plan) -> None:
        """Every plan made about a job: a win queued here stays only while the core keeps
        it queued."""
        self.ledger.unqueue(doc_id, {effect.key for effect in plan.before
                                     if isinstance(effect, core.Queue)})

    def queued_first(self, count: int | None = None) -> list[str]:
        """The jobs of the `count` wins queued longest (None: all)."""
        return [key[0] for key in self.ledger.in_state(State.QUEUED)[:count]]

    def queued_due(self, held_at_most: float) -> list[str]:
        """The jobs of wins queued for `held_at_most` seconds: to start or give back now."""
        now = time.monotonic()
        return [key[0] for key, since in self.ledger.queued().items()
                if now - since >= held_at_most]

    def batch_done(self, jobs: Container[str] | None = None) -> None:
        """Stop what was launched ahead of a start the batch did not write (refused, the
        server gone, or a newer revision that no longer calls for it): it runs on
        nothing. Its report says how far it got (core.plan_finish, late_start). With
        `jobs`, only theirs: a batch decided while another batch's write is in flight
        (Settler.write) leaves that batch's launches alone."""
        for key in self.ledger.in_state(State.LAUNCHING):
            if jobs is None or key[0] in jobs:
                self.ledger.not_launching(key)  # launched, or their revision was not saved
        for key, entry in self.ledger.unwritten([State.AHEAD, State.DUE]):
            if jobs is None or key[0] in jobs:  # (its journal entry stays until its report)
                self.ledger.start_settled(key)  # never to be written
                self.log.warning("start not written: stopping the step launched ahead",
                                 job=key[0], step=key[1], epoch=entry.epoch)
                self.counts["launches_stopped"] += 1
                self.pool.cancel(key)

    # --- after the write ----------------------------------------------------------------

    def delete_losers(self, written: list[tuple[str, core.Plan, str]]) -> None:
        """Only after the merge is saved: never delete progress we failed to keep."""
        losers = [{"_id": doc_id, "_rev": rev, "_deleted": True}
                  for doc_id, plan, _ in written for rev in plan.deletions]
        if not losers:
            return
        try:
            results = self.store.write(losers)
        except CouchError as error:  # the creator deletes them on its next decision
            self.log.warning("losing revisions not deleted", count=len(losers), error=error)
            return
        self.counts["conflicts_resolved"] += sum(isinstance(r, Saved) for r in results)

    def carried_out(self, doc_id: str, plan: core.Plan, rev: str) -> None:
        """The plan's revision is saved: count and log it, and carry out what follows."""
        # A start written late was counted as a start when it was launched (defers).
        late = plan.reason == Reason.LATE_START
        self.counts["action_late_start" if late else f"action_{plan.action}"] += 1
        self._starts_written(plan.doc, self.ledger.unwritten(job_id=doc_id))
        if plan.reason == Reason.WON_CLAIM:
            self.counts["claims_won"] += 1
        step, epoch = acted_on(plan)
        # A lease renewal comes every few seconds for every running step: not news.
        level = logging.DEBUG if plan.action == core.Action.RENEW else logging.INFO
        self.log.log(level, plan.action, job=doc_id, step=step, epoch=epoch, rev=rev,
                     detail=plan.detail or None)
        for effect in plan.after:
            self.apply(effect, plan.doc)

    def refused(self, plan: core.Plan) -> None:
        """The server refused the plan's write for good: a worker booked for a write that
        never happens is lost unless given back."""
        for effect in plan.before:
            if isinstance(effect, core.Book):
                self.apply(core.Unbook(effect.key))

    def booked_by(self, plan: core.Plan) -> bool:
        """Does a worker stay booked for a step the plan booked, with no run of ours yet?
        Then a 409 has the job decided again at once (Settler._write_all): the revision
        in the way may be our own, which the feed brings without a decision, and the
        booking would hold the worker until the booking timeout."""
        return any(isinstance(effect, core.Book) and self.pool.is_booked(effect.key)
                   and self.ledger.run(effect.key) is None for effect in plan.before)

    def conflicted(self, plan: core.Plan) -> None:
        """The plan's write met a newer revision (a 409): its launches will not happen, so
        they no longer count as running (the next decision keeps or frees the worker)."""
        for effect in plan.after:
            if isinstance(effect, core.Launch):
                self.ledger.not_launching(effect.key)

    # --- local effects ------------------------------------------------------------------

    def apply(self, effect: core.Effect, doc: Job | None = None) -> None:
        if isinstance(effect, core.Book):
            if self.ledger.run(effect.key) is not None:
                return  # a run of ours already: its start, written late (core.finish.chain_next)
            if self.pool.book(effect.key, effect.worker) is not None:
                self.ledger.book(effect.key, time.monotonic())
        elif isinstance(effect, core.Unbook):
            self.pool.unbook(effect.key)
            self.ledger.unbook(effect.key)
            self.periodic.scan_soon()  # a lost claim: look for other work at once
        elif isinstance(effect, core.Kill):
            self.log.info("killing", job=effect.key[0], step=effect.key[1], reason=effect.reason)
            self.ledger.start_settled(effect.key)
            self.pool.cancel(effect.key)
        elif isinstance(effect, core.Launch):
            assert doc is not None
            self.launch(effect, doc)
        elif isinstance(effect, core.Assign):
            self.board.note_assigned(effect.key, effect.site, time.monotonic())
        elif isinstance(effect, core.Revoke):
            self.board.forget(effect.site)
        elif isinstance(effect, core.Queue):
            self.ledger.queue(effect.key, time.monotonic())

    def launch(self, effect: core.Launch, doc: Job) -> None:
        job_id, index = effect.key
        # Carried out now (an execution from here on, or none): no longer a launch to come.
        self.ledger.not_launching(effect.key)
        running = self.ledger.run(effect.key)
        if running == core.Running(effect.worker, effect.epoch):
            return  # launched ahead of this very write (plan_made)
        if running is not None:  # the core never asks this; never run a step twice
            self.log.error("not launching a step already running here", job=job_id, step=index)
            return
        if (effect.key, effect.epoch) in self.ledger.launched:
            # A fencing token this site issued already (a run of ours the document never
            # showed started): no second run in it. The start stands with no worker
            # behind it, and the next decision releases it into a new epoch.
            self.log.error("not launching a step again in an epoch it ran in here",
                           job=job_id, step=index, epoch=effect.epoch)
            return
        env = {
            "JOBDIST_JOB_ID": job_id,
            "JOBDIST_STEP": str(index),
            "JOBDIST_SITE": self.site,
            "JOBDIST_EPOCH": str(effect.epoch),
            "JOBDIST_COUCH": self.store.url,  # with JOBDIST_SITE: finds orphans after a crash
        }
        self.ledger.unbook(effect.key)
        execution = self.pool.start(
            effect.key, effect.epoch, doc["job"][index], env,
            on_retry=self.mailbox.retry_reporter(effect.key, effect.epoch, effect.worker))
        self.ledger.started(effect.key, execution.worker, effect.epoch,
                            core.follows(doc, index))
        self.counts["steps_started"] += 1

    # --- bookings past their timeout ------------------------------------------------------

    def expired_bookings(self) -> list[StepKey]:
        """The bookings held past their timeout: their jobs to decide about again."""
        now = time.monotonic()
        return [key for key, since in self.ledger.booked_since().items()
                if now - since >= self.timings.booking_timeout]

    def unbook_expired(self) -> None:
        """Bookings still held past their timeout once decided: their job is gone."""
        for key in self.expired_bookings():
            if self.pool.is_booked(key):
                self.apply(core.Unbook(key))

    def release_bookings(self) -> None:
        """Give back every booked worker (a graceful stop claims nothing more)."""
        for key in list(self.pool.bookings()):
            self.apply(core.Unbook(key))


def only_starts(doc: Job | None, leaf: Job) -> bool:
    """Does the revision add nothing to the leaf's history but its start?"""
    if doc is None:
        return False
    history, before = doc["history"], leaf["history"]
    return len(history) == len(before) + 1 and history[-1]["event"] == "started" \
        and history[:-1] == before  # (nothing shed from a full history either)


def acted_on(plan: core.Plan) -> tuple[int | None, int | None]:
    """The step and epoch a plan's write is about, for its log line: those of the
    event it records (a plan that records none, a re-save, gives its current step)."""
    if plan.doc is None:
        return None, None
    history = plan.doc["history"]
    if not history:
        return plan.doc["step"], None
    return history[-1].get("step", plan.doc["step"]), history[-1].get("epoch")
