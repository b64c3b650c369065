"""A simulated replicated document store and sites that run the decision core.

Each replica keeps, per document, a revision tree as CouchDB does: a write
names the `_rev` of a leaf and extends that branch (any leaf, a losing one
included), replication copies revisions, and the winner is the live leaf with
the longest history, ties to the highest `_rev` string. Sites execute the
plans of `jobdist.core` against their own replica only.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from jobdist import core
from jobdist.clock import format_time
from jobdist.couch import Conflict, Saved
from jobdist.model import (
    Doc,
    Job,
    Leaf,
    Phase,
    Progress,
    StepKey,
    awaited,
    counting_runs,
    is_broadcast,
    is_live,
    is_waiting,
    json_copy,
    normalise,
    step_phase,
    sub_runs,
    targets,
)
from jobdist.store import Open, Written

from .audit import counted, why_superseded


@dataclass(frozen=True)
class Revision:
    rev: str
    parent: str | None
    body: Doc | None  # None: a deleted leaf


@dataclass
class Replica:
    docs: dict[str, dict[str, Revision]] = field(default_factory=dict)

    def leaves(self, doc_id: str) -> list[Revision]:
        tree = self.docs.get(doc_id, {})
        parents = {r.parent for r in tree.values()}
        return [r for r in tree.values() if r.rev not in parents]

    def live_leaves(self, doc_id: str) -> list[Doc]:
        docs = []
        for leaf in self.leaves(doc_id):
            if leaf.body is not None:
                docs.append({**json_copy(leaf.body), "_id": doc_id, "_rev": leaf.rev})
        return docs

    def winner(self, doc_id: str) -> Doc | None:
        live = self.live_leaves(doc_id)
        return max(live, key=core.couch_order) if live else None

    def write(self, doc: Leaf) -> str | None:
        """PUT: extends the named leaf; the new rev, or None (a 409) when `_rev` is not a leaf."""
        doc_id = doc["_id"]
        parent = doc.get("_rev")
        tree = self.docs.setdefault(doc_id, {})
        if parent is None:
            if any(leaf.body is not None for leaf in self.leaves(doc_id)):
                return None
        elif parent not in {leaf.rev for leaf in self.leaves(doc_id)}:
            return None
        deleted = bool(doc.get("_deleted"))
        body = None if deleted else {k: v for k, v in doc.items() if k not in ("_id", "_rev")}
        depth = int(parent.split("-")[0]) + 1 if parent else 1
        digest = hashlib.md5(
            json.dumps([parent, body, deleted], sort_keys=True).encode()
        ).hexdigest()
        rev = f"{depth}-{digest}"
        tree[rev] = Revision(rev, parent, json_copy(body))
        return rev

    def pull(self, source: Replica, doc_id: str) -> bool:
        """Replicate one document from source; True if anything new arrived."""
        mine = self.docs.setdefault(doc_id, {})
        new = False
        for rev, revision in source.docs.get(doc_id, {}).items():
            if rev not in mine:
                mine[rev] = revision  # never changed once written: shared
                new = True
        return new


@dataclass
class Execution:
    key: StepKey
    epoch: int
    worker: str
    site: str
    # The end of the step before that the run followed (core.follows), as the daemon's
    # ledger records it: a run after an end that no longer counts is a stale finish.
    after: str | None = field(default=None, compare=False)


@dataclass
class Outcome:
    ok: bool = True
    used_alt: bool = False
    exit_code: int | None = 0
    attempts: int = 1
    exec_time: float = 1.0
    start_time: str = "2026-01-01T00:00:00.000000Z"
    finish_time: str = "2026-01-01T00:00:01.000000Z"
    stdout: str = ""
    stderr: str = ""
    reason: str = "exit 0"
    cancelled: bool = False
    progress: Progress | None = None


class Clock:
    def __init__(self) -> None:
        self.base = datetime(2026, 1, 1, tzinfo=UTC)
        self.seconds = 0.0

    def now(self) -> str:
        return format_time(self.base + timedelta(seconds=self.seconds))


class SimSite:
    """A site: its replica, its workers, and the manager's execution of plans."""

    def __init__(self, name: str, workers: int, clock: Clock, ledger: list[Execution],
                 known_sites: frozenset[str] | None = None, lease: float = 1e6) -> None:
        self.name = name
        self.lease = lease
        self.replica = Replica()
        self.workers = [f"{name}/w{n}" for n in range(1, workers + 1)]
        self.clock = clock
        self.ledger = ledger
        self.known_sites = known_sites
        self.booked: dict[StepKey, tuple[str, float]] = {}
        self.running: dict[StepKey, Execution] = {}
        self.queued: dict[StepKey, float] = {}  # wins held for a worker (placement.queues), since
        self.free_at: dict[str, float] = {}  # see pool
        self.queue_limit = workers  # 0: a site that releases a win no worker is free for
        self.killed: list[Execution] = []
        self.dying: list[Execution] = []  # killed, their cancelled result not yet reported
        self.crashed: list[Execution] = []  # running or dying when the site restarted
        # What the site believes of the others' room and of its creators (status
        # documents): set by the tests, right or wrong, never derived from the truth.
        self.room: dict[str, int] | None = None
        self.assigning: frozenset[str] = frozenset()
        # Creators the site believes gave it a step lately (right or wrong), a belief
        # that here never lapses: core.FED_CLAIM_DELAY must still let claims come.
        self.fed_by: frozenset[str] = frozenset()
        # Succession: the lines, and which sites this one believes silent (right or wrong).
        self.successors: dict[str, tuple[str, ...]] = {}
        self.silent: frozenset[str] = frozenset()
        self.restart()

    def restart(self) -> None:
        """A crash: every booking and execution is gone, the replica stays."""
        self.crashed += [*self.running.values(), *self.dying]
        self.booked.clear()
        self.running.clear()
        self.queued.clear()
        self.dying.clear()
        self.free_at.clear()  # a new daemon's workers are free since it started

    def report_killed(self) -> None:
        """Killed executions report a cancelled result, as a real worker does."""
        while self.dying:
            execution = self.dying.pop(0)
            plan = core.plan_finish(
                self.replica.live_leaves(execution.key[0]), self.ctx(), self.pool(),
                execution.key, execution.epoch, execution.worker,
                Outcome(ok=False, cancelled=True, exit_code=None, reason="cancelled"),
                after=execution.after)
            self.execute(execution.key[0], plan)

    def ctx(self) -> core.Context:
        return core.Context(self.name, self.clock.now(), self.known_sites, booking_timeout=30.0,
                            lease=self.lease, skew_margin=5.0, room=self.room,
                            assigning=self.assigning, successors=self.successors,
                            fed_by=self.fed_by,
                            silent=self.silent - {self.name}, ended=self.ended())

    def ended(self) -> dict[str, str]:
        """How each job ended that this replica shows ended (what the manager reads
        for the jobs its waiting jobs name)."""
        statuses: dict[str, str] = {}
        for doc_id in self.replica.docs:
            leaves = self.replica.live_leaves(doc_id)
            status = core.merge(leaves)["job_status"] if leaves else None
            if status is not None:
                statuses[doc_id] = status
        return statuses

    def heartbeat(self) -> None:
        """Renew the lease of every execution this site runs, with a progress report
        that names the execution (see check_progress_is_the_current_runs)."""
        for key, execution in sorted(self.running.items()):
            plan = core.plan_renew(self.replica.live_leaves(key[0]), self.ctx(), key,
                                   execution.epoch, report=self.progress_report(execution))
            if plan.doc is not None:
                self.execute(key[0], plan)

    def progress_report(self, execution: Execution) -> Progress:
        return {"fraction": 0.5, "message": f"{self.name} epoch {execution.epoch}",
                "at": self.clock.now()}

    def pool(self) -> core.PoolView:
        taken = {w for w, _ in self.booked.values()} | {e.worker for e in self.running.values()}
        free = tuple(w for w in self.workers if w not in taken)
        # When each worker became free, as first seen here (never earlier than the truth,
        # so claims come no sooner than a real site's).
        self.free_at = {w: self.free_at.get(w, self.clock.seconds) for w in free}
        return core.PoolView(
            free_workers=free,
            idle_for=self.clock.seconds - min(self.free_at.values(), default=self.clock.seconds),
            booked={k: core.Booking(w, self.clock.seconds - t)
                    for k, (w, t) in self.booked.items()},
            running={k: core.Running(e.worker, e.epoch, after=e.after)
                     for k, e in self.running.items()},
            queued={k: self.clock.seconds - t for k, t in self.queued.items()},
            queue_limit=self.queue_limit,
        )

    def process(self, doc_id: str) -> str:
        """Decide about one document until nothing more is to be done; last action."""
        action = "none"
        for _ in range(10):
            plan = core.plan(self.replica.live_leaves(doc_id), self.ctx(), self.pool())
            if plan.action == "none":
                self.decided(doc_id, plan)
                return action
            self.execute(doc_id, plan)
            action = plan.action
            if action == core.Action.QUEUE:  # no write: nothing more until a worker frees
                return action
        raise AssertionError(f"{self.name} does not settle on {doc_id}")

    def process_stale(self, doc_id: str, pick: int) -> None:
        """Look at an old revision, as a late change from the feed shows it.

        As the manager does: an old view may only say there is nothing to do;
        when it suggests an action, the site decides again on its current leaves.
        """
        bodies = [(r.rev, r.body) for r in self.replica.docs.get(doc_id, {}).values()
                  if r.body is not None]
        if not bodies:
            return
        rev, body = bodies[pick % len(bodies)]
        view = {**json_copy(body or {}), "_id": doc_id, "_rev": rev}
        if core.plan([view], self.ctx(), self.pool()).action != "none":
            self.process(doc_id)

    def finish(self, key: StepKey, outcome: Outcome | None = None) -> None:
        execution = self.running.pop(key)
        plan = core.plan_finish(
            self.replica.live_leaves(key[0]), self.ctx(), self.pool(), key,
            execution.epoch, execution.worker,
            outcome or Outcome(progress=self.progress_report(execution)), after=execution.after,
        )
        self.execute(key[0], plan)

    def decided(self, doc_id: str, plan: core.Plan) -> None:
        """As the manager's PlanRunner.decided: a held win stays held only while the core
        keeps holding it."""
        held = {e.key for e in plan.before if isinstance(e, core.Queue)}
        for key in [key for key in self.queued if key[0] == doc_id and key not in held]:
            del self.queued[key]

    def execute(self, doc_id: str, plan: core.Plan) -> None:
        self.decided(doc_id, plan)
        for effect in plan.before:
            self.apply(effect)
        if plan.doc is not None:
            launches = [effect for effect in plan.after if isinstance(effect, core.Launch)]
            assert not (launches and is_waiting(plan.doc)), f"{self.name} starts a waiting job"
            assert self.replica.write(plan.doc), "writes go on a leaf"
        for rev in plan.deletions:
            assert self.replica.write({"_id": doc_id, "_rev": rev, "_deleted": True})
        for effect in plan.after:
            self.apply(effect, plan.doc)

    def apply(self, effect: core.Effect, doc: Job | None = None) -> None:
        if isinstance(effect, core.Book):
            self.booked.setdefault(effect.key, (effect.worker, self.clock.seconds))
        elif isinstance(effect, core.Unbook):
            self.booked.pop(effect.key, None)
        elif isinstance(effect, core.Launch):
            assert effect.key not in self.running, f"{self.name} runs {effect.key} twice at once"
            worker, _ = self.booked.pop(effect.key)
            assert worker == effect.worker
            after = core.follows(doc, effect.key[1]) if doc is not None else None
            execution = Execution(effect.key, effect.epoch, effect.worker, self.name, after)
            self.running[effect.key] = execution
            self.ledger.append(execution)
        elif isinstance(effect, core.Assign) and self.room is not None:
            self.room[effect.site] = self.room.get(effect.site, 0) - 1  # as the Board counts
        elif isinstance(effect, core.Revoke) and self.room is not None:
            self.room.pop(effect.site, None)  # as the Board forgets a revoked site
        elif isinstance(effect, core.Queue):
            self.queued.setdefault(effect.key, self.clock.seconds)
        elif isinstance(effect, core.Kill):
            execution = self.running.pop(effect.key)
            self.killed.append(execution)
            self.dying.append(execution)


def check_progress_is_the_current_runs(replicas: Iterable[Replica], job_ids: list[str]) -> None:
    """Every progress a merged step shows came from the execution the step names: never
    from a stale or released run (SimSite.progress_report names its execution)."""
    for replica in replicas:
        for doc_id in job_ids:
            leaves = replica.live_leaves(doc_id)
            if not leaves:
                continue
            for step in core.merge(leaves)["job"]:
                progress = step.get("progress")
                if progress:
                    assert progress["message"] == f"{step['winner']} epoch " \
                        f"{step['epoch']}", (doc_id, step)
                for site, run in sub_runs(step).items():  # a broadcast step's, per site
                    part_progress = run.get("progress")
                    if part_progress:
                        assert part_progress["message"] == f"{site} epoch {run['epoch']}", \
                            (doc_id, site, run)


def check_no_double_execution(ledger: list[Execution], *, per_site: bool = False) -> None:
    """No step of a job ever has two executions with the same fencing token.

    The token is the epoch; with `per_site` it is (epoch, site): after a
    revocation, a site on a losing branch can issue an epoch number that
    another site issues too, and a report still only counts for the step's
    current epoch *and* winner (core.backs_execution).
    """
    seen: dict[tuple[object, ...], str] = {}
    for execution in ledger:
        ident: tuple[object, ...] = (*execution.key, execution.epoch)
        if per_site:
            ident = (*ident, execution.site)
        assert ident not in seen, f"two executions of {ident}: {seen[ident]} and {execution.site}"
        seen[ident] = execution.site


def check_duplicates_explained(sites: list[SimSite], job_ids: list[str],
                               ledger: list[Execution]) -> None:
    """Every run that did not count is explained by the job's history, as the fault
    suite's audit explains it (a release, a stale finish, or an end on a branch the
    merge left while two creators arbitrated), unless its site crashed before it could
    record anything; and the counted runs really ran."""
    for doc_id in job_ids:
        final = core.merge(sites[0].replica.live_leaves(doc_id))
        runs = {(e.key[1], e.epoch, e.site) for e in ledger if e.key[0] == doc_id}
        crashed = {(e.key[1], e.epoch, e.site) for site in sites for e in site.crashed
                   if e.key[0] == doc_id}
        kept = set(counted(final))
        assert kept <= runs, f"{doc_id}: counted {kept - runs}, which never ran"
        for run in sorted(runs - kept - crashed):
            assert why_superseded(final["history"], run), (doc_id, run, final["history"])


class SimStore:
    """The manager's JobStore (jobdist.store) on a simulated replica: views read winners."""

    def __init__(self, replica: Replica, name: str) -> None:
        self.replica = replica
        self.url = f"sim://{name}"
        self.checkpoints: dict[str, object] = {}

    def read(self, ids: Iterable[str]) -> dict[str, list[Doc]]:
        return {doc_id: self.replica.live_leaves(doc_id) for doc_id in ids}

    def write(self, docs: Sequence[Doc]) -> list[Written]:
        results: list[Written] = []
        for doc in docs:
            rev = self.replica.write(copy.deepcopy(doc))
            results.append(Conflict(doc["_id"]) if rev is None else Saved(doc["_id"], rev))
        return results

    def live_jobs(self) -> Iterator[Doc]:
        for doc_id in sorted(self.replica.docs):
            doc = self.replica.winner(doc_id)
            if doc is not None and doc.get("type") == "job" and is_live(doc):
                yield doc

    def open_created(self, creator: str, limit: int) -> list[str]:
        rows = [doc for doc in self.live_jobs() if doc["creator"] == creator
                and step_phase(doc["job"][doc["step"]]) == Phase.OPEN and not is_waiting(doc)]
        oldest = sorted(rows, key=lambda doc: doc["updated_at"])[:limit]
        return [doc["_id"] for doc in sorted(oldest, key=core.doc_rank)]

    def statuses(self) -> list[Doc]:
        return [doc for doc_id in sorted(self.replica.docs) if doc_id.startswith("site-")
                and (doc := self.replica.winner(doc_id)) is not None]

    def claimable(self, target: str, limit: int) -> list[Open]:
        """As the view: open steps by target, and broadcast sub-runs waiting at a site."""
        rows = [Open(doc["_id"], core.doc_rank(doc), doc["created_at"])
                for doc in self.live_jobs()
                if (step_phase(doc["job"][doc["step"]]) == Phase.OPEN and not is_waiting(doc)
                    and target in targets(doc["job"][doc["step"]]))
                or core.sub_run_open(doc["job"][doc["step"]], target)]
        return sorted(rows, key=lambda row: (row.rank, row.created_at))[:limit]

    def leases_due(self, creator: str, cutoff: str) -> list[str]:
        return [doc["_id"] for doc in self.live_jobs() if doc["creator"] == creator
                and any(lease <= cutoff for lease in core.current_leases(normalise(doc)))
                and Phase.WON <= step_phase(doc["job"][doc["step"]]) <= Phase.RUNNING]

    def involving(self, site: str) -> Iterator[str]:
        for doc in self.live_jobs():
            step = doc["job"][doc["step"]]
            if site in (doc["creator"], step.get("claimed_by"), step.get("winner")) or \
                    (is_broadcast(step) and site in counting_runs(step)):
                yield doc["_id"]

    def waiting(self, creator: str) -> list[str]:
        return [doc["_id"] for doc in self.live_jobs()
                if doc["creator"] == creator and is_waiting(doc)]

    def waiting_on(self, ids: Sequence[str]) -> list[tuple[str, str]]:
        return [(doc["_id"], doc["creator"]) for doc in self.live_jobs() if is_waiting(doc)
                for awaited_id in awaited(doc) if awaited_id in ids]

    def save_checkpoint(self, site: str, seq: object) -> None:
        self.checkpoints[site] = seq
