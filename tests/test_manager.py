"""The real work manager at three sites, on simulated replicas: no servers.

Each site is a real `Manager` (batched decisions, its real worker pool
running shell commands) over a `SimStore` on its own replica of CouchDB
revision trees (jobdist/lab/sim.py). The test plays the listener, handing each
manager the documents whose leaves changed on its replica, and the
replicator, copying revisions between replicas in a random order, some late.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future
from datetime import UTC, datetime, timedelta
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

import pytest

from jobdist import core, status
from jobdist.clock import format_time
from jobdist.config import (
    SETTINGS,
    CouchSettings,
    DaemonSettings,
    SiteConfig,
    SuccessionSettings,
    TuningSettings,
)
from jobdist.couch import Unavailable
from jobdist.journal import Journal, unwritten_start
from jobdist.lab.sim import Clock, Execution, Replica, SimSite, SimStore
from jobdist.ledger import State
from jobdist.listener import Changed
from jobdist.manager import Manager
from jobdist.model import Doc, Reason, new_job, new_step, sub_runs
from jobdist.periodic_work import PROGRESS_INTERVAL
from jobdist.store import Written

from .helpers import in_tmp, wait_for

T = TypeVar("T")
SITES = ("global", "reg_a", "reg_b")
TARGETS: tuple[str | list[str], ...] = ("any", "any", "global", "reg_a", ["reg_a", "reg_b"])


class CountingStore(SimStore):
    """A SimStore that counts the manager's requests, and the documents in them."""

    def __init__(self, replica: Replica, name: str) -> None:
        super().__init__(replica, name)
        self.calls: Counter[str] = Counter()
        self.reads_of: Counter[str] = Counter()  # by document
        self.written: list[list[str]] = []  # the documents of each write

    def read(self, ids: Iterable[str]) -> dict[str, list[Doc]]:
        ids = list(ids)
        self.calls["reads"] += 1
        self.calls["docs_read"] += len(ids)
        self.reads_of.update(ids)
        return super().read(ids)

    def write(self, docs: Sequence[Doc]) -> list[Written]:
        self.written.append([doc["_id"] for doc in docs])
        self.calls["writes"] += 1
        self.calls["docs_written"] += len(docs)
        return super().write(docs)


class SlowAnswers(Executor):
    """A manager's writer (Settler.write) whose writes the store takes at once, in the
    manager's own thread, and whose answers come `delay` seconds later: the manager
    serves its workers' reports while each write is in flight. (A server may take a
    write long before its answer arrives; nothing but the answer moves to a thread.)"""

    def __init__(self, delay: float = 0.02) -> None:
        self.delay = delay
        self.answered_at: list[float] = []  # monotonic, one a write

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        answer: Future[T] = Future()
        try:
            result = fn(*args, **kwargs)
        except Exception as error:  # the answer is an error: raised where it is awaited
            deliver: Callable[[], None] = partial(answer.set_exception, error)
        else:
            deliver = partial(answer.set_result, result)

        def arrive() -> None:
            self.answered_at.append(time.monotonic())
            deliver()
        timer = threading.Timer(self.delay, arrive)
        timer.daemon = True
        timer.start()
        return answer


class OutageStore(CountingStore):
    """A CountingStore whose server can be down: every request fails as one that gets no
    answer, while its daemon runs on (World.weather). With `answers_lost`, a write the
    server took fails all the same: its answer never came back."""

    down = False
    answers_lost = False

    def __getattribute__(self, name: str) -> Any:
        if name in REQUESTS and object.__getattribute__(self, "down"):
            raise Unavailable(f"{name} failed: ConnectionError: refused")
        if name == "write" and object.__getattribute__(self, "answers_lost"):
            return object.__getattribute__(self, "_write_unanswered")
        return object.__getattribute__(self, name)

    def _write_unanswered(self, docs: Sequence[Doc]) -> list[Written]:
        super().write(docs)
        raise Unavailable("write failed: ReadTimeout: the answer never came")


REQUESTS = frozenset(name for name in dir(SimStore) if not name.startswith("_")) - {"url"}


class World:
    """Three managers, their replicas, a replicator with lag and a feed for each."""

    def __init__(self, tmp_path: Path, seed: int, workers: int = 2, lag: float = 0.3,
                 answer_delay: float | None = None, **settings: Any) -> None:
        """With `answer_delay`, each manager's writes are answered that late (SlowAnswers)."""
        self.rng = random.Random(seed)
        self.lag = lag  # the chance that a document misses one round of replication
        self.stores = {name: OutageStore(Replica(), name) for name in SITES}
        self.outages_until = 0.0  # servers go down now and then until this monotonic time
        self.back_at: dict[str, float] = {}  # a server that is down: when it answers again
        self.managers = {
            name: Manager(in_tmp(SiteConfig(name, CouchSettings(store.url), workers=workers,
                                             **settings), tmp_path),
                          store, SITES, Journal(tmp_path / name),
                          writer=None if answer_delay is None else SlowAnswers(answer_delay))
            for name, store in self.stores.items()}
        self.dead: set[str] = set()  # sites that neither serve nor replicate
        self.delivered: dict[str, dict[str, frozenset[str]]] = {name: {} for name in SITES}
        self.seq = 0

    def submit(self, jobs: list[list[Doc]], creator: str = "global") -> list[str]:
        docs = [new_job(creator, steps) for steps in jobs]
        assert all(self.stores[creator].write(docs))
        return [doc["_id"] for doc in docs]

    def replicate(self) -> None:
        for source in SITES:
            for target in SITES:
                if source == target or {source, target} & (self.dead | set(self.back_at)):
                    continue
                for doc_id in list(self.stores[source].replica.docs):
                    if self.rng.random() >= self.lag:
                        self.stores[target].replica.pull(self.stores[source].replica, doc_id)

    def feed(self) -> None:
        """What `_changes` would bring each site: its winners, with their conflicts."""
        for name, store in self.stores.items():
            if name in self.dead or name in self.back_at:
                continue
            replica = store.replica
            for doc_id in self.rng.sample(sorted(replica.docs), len(replica.docs)):
                leaves = frozenset(leaf.rev for leaf in replica.leaves(doc_id))
                if self.delivered[name].get(doc_id) == leaves:
                    continue
                self.delivered[name][doc_id] = leaves
                winner = replica.winner(doc_id)
                if winner is not None:
                    others = [rev for rev in leaves if rev != winner["_rev"]
                              and any(live["_rev"] == rev
                                      for live in replica.live_leaves(doc_id))]
                    winner = {**winner, **({"_conflicts": others} if others else {})}
                self.seq += 1
                self.managers[name].mailbox.inbox.put(
                    Changed(doc_id, winner["_rev"] if winner else "", self.seq, winner))

    def run(self, ids: list[str], timeout: float = 60.0) -> dict[str, Doc]:
        """Replicate, feed and serve until every site sees every job ended."""
        deadline = time.monotonic() + timeout
        while not self.settled(ids):
            assert time.monotonic() < deadline, f"jobs did not end: {self.live(ids)}"
            self.weather()
            self.replicate()
            self.feed()
            self.serve()
            time.sleep(0.01)  # the workers' `true` runs meanwhile
        alive = next(name for name in SITES if name not in self.dead)
        return {doc_id: core.merge(self.stores[alive].replica.live_leaves(doc_id))
                for doc_id in ids}

    def weather(self) -> None:
        """A server that is down comes back on time; until `outages_until`, one goes
        down now and then, for 50-300 ms (far less than a lease: no step is revoked)."""
        now = time.monotonic()
        for name, back in list(self.back_at.items()):
            if now >= back:
                del self.back_at[name]
                self.stores[name].down = self.stores[name].answers_lost = False
        if now < self.outages_until and self.rng.random() < 0.15:
            name = self.rng.choice(SITES)
            self.back_at.setdefault(name, now + self.rng.uniform(0.05, 0.3))
            # Half the outages begin with writes that are taken but never answered.
            if self.rng.random() < 0.5 and not self.stores[name].down:
                self.stores[name].answers_lost = True
            else:
                self.stores[name].down = True

    def serve(self) -> None:
        for name, manager in self.managers.items():
            if name not in self.dead:
                manager.serve_once(timeout=0)

    def live(self, ids: list[str]) -> list[str]:
        return [doc_id for name, store in self.stores.items() if name not in self.dead
                for doc_id in ids
                if (doc := store.replica.winner(doc_id)) is None or doc["job_status"] is None]

    def settled(self, ids: list[str]) -> bool:
        """Every job ended, every server up, no result held (a write the server took
        whose answer was lost is tried again, and found written)."""
        return not self.back_at and not self.live(ids) and not any(
            manager.held for name, manager in self.managers.items() if name not in self.dead)

    def stop(self) -> None:
        for manager in self.managers.values():
            manager.pool.shutdown(1.0)


@pytest.fixture
def world(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[World]:
    """A World; its param: a seed, or (seed, answer delay) for writes in flight."""
    param = getattr(request, "param", 1)
    seed, delay = param if isinstance(param, tuple) else (param, None)
    built = World(tmp_path, seed=seed, answer_delay=delay)
    try:
        yield built
    finally:
        built.stop()


def started(doc: Doc) -> list[tuple[int, int, str]]:
    """Every execution the history records: (step, epoch, site)."""
    return [(entry["step"], entry["epoch"], entry["site"]) for entry in doc["history"]
            if entry["event"] == "started"]


IN_FLIGHT = [(1, 0.02), (2, 0.005)]  # seeds, and how late each write is answered


@pytest.mark.parametrize("world", [1, 2, 3, *IN_FLIGHT], indirect=True)
def test_every_step_runs_once_in_order_on_an_allowed_site(world: World) -> None:
    rng = random.Random(7)
    ids = world.submit([[new_step("true", target=rng.choice(TARGETS))
                         for _ in range(rng.randint(1, 3))] for _ in range(30)])
    docs = world.run(ids)
    executions = sum(m.counts["steps_started"] for m in world.managers.values())
    assert executions == sum(len(doc["job"]) for doc in docs.values())  # none twice
    for doc in docs.values():
        assert doc["job_status"] == "success", doc["history"]
        runs = started(doc)
        assert [step for step, _, _ in runs] == list(range(len(doc["job"])))
        for step, _, site in runs:
            target = doc["job"][step]["target"]
            assert target == "any" or site == target or site in target
    for manager in world.managers.values():
        assert manager.counts["handler_errors"] == 0
    assert_overlapped(world)


def assert_overlapped(world: World) -> None:
    """With writes answered late, reports were decided while writes were in flight."""
    if any(manager.settler.writer is not None for manager in world.managers.values()):
        assert sum(m.counts["decided_while_writing"] for m in world.managers.values()), \
            "no report came while a write was in flight: the test tested nothing new"


STOPPED_AHEAD = "stopped on this site: cancelled"  # (core.plan_finish; "... before start")
WORKER_LOST = "worker lost"  # (core.on_running: a start recorded here with no run behind it)


def released_after(doc: Doc, detail: str) -> set[tuple[int, int]]:
    """The runs (step, epoch) a release with `detail` ended (a release raises the epoch)."""
    return {(entry["step"], entry["epoch"] - 1) for entry in doc["history"]
            if entry["event"] == "released" and entry["detail"].startswith(detail)}


@pytest.mark.parametrize("world", [1, 2, 3, *IN_FLIGHT], indirect=True)
def test_outages_of_a_sites_server_never_run_a_step_twice_in_one_epoch(world: World) -> None:
    """Each site's server goes down now and then while its daemon runs on: an end is
    held until the server is back, a start launched ahead that could not be written is
    stopped, a start the server took but never answered is released (it never ran).
    Every run is in the job's history, no epoch runs twice, each step finishes once, in
    order, and every job ends."""
    rng = random.Random(11)
    ids = world.submit([[new_step(rng.choice(["true", "sleep 0.1"]), target=rng.choice(TARGETS))
                         for _ in range(rng.randint(1, 3))] for _ in range(30)])
    world.outages_until = time.monotonic() + 5.0
    docs = world.run(ids)
    executions = sum(m.counts["steps_started"] for m in world.managers.values())
    reruns = never_ran = 0
    for doc in docs.values():
        assert doc["job_status"] == "success", doc["history"]
        runs = [(step, epoch) for step, epoch, _ in started(doc)]
        assert len(set(runs)) == len(runs) and runs == sorted(runs), doc["history"]
        finished = [entry["step"] for entry in doc["history"] if entry["event"] == "finished"]
        assert finished == list(range(len(doc["job"]))), doc["history"]
        # A step starts again only after a run launched ahead of a start the server did
        # not take was stopped, and its stop recorded; or after a start the server took
        # whose answer was lost, never run, was released.
        stopped, lost = released_after(doc, STOPPED_AHEAD), released_after(doc, WORKER_LOST)
        again = {run for run, later in pairwise(runs) if run[0] == later[0]}
        assert again <= stopped | lost, doc["history"]
        reruns += len(again - lost)
        never_ran += len(lost)
    assert executions == sum(len(started(doc)) for doc in docs.values()) - never_ran
    counts = {name: manager.counts for name, manager in world.managers.items()}
    assert reruns <= sum(count["launches_stopped"] for count in counts.values())
    for manager in world.managers.values():
        assert manager.counts["handler_errors"] == 0
        assert not manager.held and len(manager.journal) == 0
    assert sum(count["results_held"] for count in counts.values()), \
        "no outage came while a step ended: the test tested nothing"
    assert_overlapped(world)


def test_a_batch_reads_and_writes_many_jobs_at_once(world: World) -> None:
    ids = world.submit([[new_step("true")] for _ in range(60)])
    world.run(ids)
    creator = world.stores["global"].calls
    # One job at a time cost a read and a write per decision, and each job needs two
    # at the creator at least (start, finish): four requests a job. Batches share the
    # writes, and decisions made on revisions the feed showed or we wrote need no read.
    # (The rounds depend on how the worker threads interleave: 74-86 requests here.)
    assert creator["docs_written"] / creator["writes"] > 2, creator
    assert creator["reads"] + creator["writes"] < 2 * len(ids), creator
    for manager in world.managers.values():
        assert manager.counts["handler_errors"] == 0


def test_a_worker_booked_in_a_batch_is_not_taken_by_a_later_decision(tmp_path: Path) -> None:
    """Two steps won at once with one worker, itself booked for an undecided claim: the
    first win takes the worker, the second is held for it (a queue of one a worker);
    nothing is started twice on one worker, nothing fails to launch."""
    store = SimStore(Replica(), "reg_a")
    # (Starts written at once, to be read here: see test_a_short_steps_start_is_written...)
    manager = Manager(in_tmp(SiteConfig("reg_a", CouchSettings(store.url), workers=1,
                                        tuning=TuningSettings(start_write_delay=0)), tmp_path),
                      store, SITES, Journal(tmp_path / "journal"))
    try:
        claimed, first, second = (new_job("global", [new_step("true")]) for _ in range(3))
        claimed["job"][0]["claimed_by"] = "reg_a"
        for won in (first, second):
            won["job"][0].update(claimed_by="reg_a", winner="reg_a", epoch=1,
                                 lease_until="2999-01-01T00:00:00.000000Z")
        assert all(store.write([claimed, first, second]))
        manager.runner.apply(core.Book((claimed["_id"], 0), "reg_a/w1"))  # our claim's worker
        manager.settle([manager.decide_task(first["_id"]), manager.decide_task(second["_id"])])
        assert manager.counts["handler_errors"] == 0
        assert manager.counts["steps_started"] == 1
        statuses = {doc_id: store.replica.winner(doc_id)["job"][0]
                    for doc_id in (first["_id"], second["_id"])}
        assert sorted(str((step["step_status"], step["winner"])) for step in statuses.values()) \
            == ["('running', 'reg_a')", "(None, 'reg_a')"]  # one started, the other held
        assert [key[0] for key in manager.ledger.in_state(State.QUEUED)] == \
            [doc_id for doc_id, step in statuses.items() if step["step_status"] is None]
    finally:
        manager.pool.shutdown(1.0)


def test_the_core_sees_how_long_a_worker_has_been_free_since_its_step_ended(
        tmp_path: Path) -> None:
    """Claims on an assigning creator's steps wait for a worker free a while
    (core.placement.holds_claims): a worker a step just freed counts from its end."""
    store = SimStore(Replica(), "reg_a")
    manager = Manager(in_tmp(SiteConfig("reg_a", CouchSettings(store.url), workers=2), tmp_path),
                      store, SITES, Journal(tmp_path / "journal"))
    try:
        time.sleep(0.2)
        idle_for = manager.pool_view().idle_for
        assert idle_for is not None and idle_for >= 0.2
        doc = won_here("reg_a", "sleep 0.3")
        assert all(store.write([doc]))
        manager.process(doc["_id"])
        assert manager.counts["steps_started"] == 1
        wait_for(lambda: manager.serve_once(0.05) or manager.counts["steps_finished"] == 1, 10)
        idle_for = manager.pool_view().idle_for  # the other worker is free since the start
        assert idle_for is not None and idle_for >= 0.4
        manager.runner.apply(core.Book(("held", 0), "reg_a/w2"))  # the step ran on w1
        idle_for = manager.pool_view().idle_for  # left: the worker the step freed
        assert idle_for is not None and idle_for < 0.2
        # A result not recorded yet (held while the server is down) keeps its worker
        # busy, and the worker's idle time starts once it is recorded.
        manager.ledger.unrecorded(("unrecorded", 0), "reg_a/w1", 1)
        time.sleep(0.3)
        assert manager.pool_view().free_workers == ()
        manager.ledger.recorded(("unrecorded", 0), 1)
        idle_for = manager.pool_view().idle_for
        assert idle_for is not None and idle_for < 0.2
    finally:
        manager.pool.shutdown(1.0)


def test_another_sites_revision_is_validated_only_when_it_calls_for_an_action(
        tmp_path: Path) -> None:
    """Validation guards what a site acts on: another site's job whose revision calls for
    nothing here is not checked (its creator reports it); one that would be claimed is
    checked first, and skipped with the reason."""
    store = SimStore(Replica(), "reg_a")
    manager = Manager(in_tmp(SiteConfig("reg_a", CouchSettings(store.url), workers=1), tmp_path),
                      store, SITES, Journal(tmp_path / "journal"))
    try:
        running = new_job("global", [new_step("true")])
        running["job"][0].update(claimed_by="global", winner="global", epoch=1,
                                 step_status="running", retry_strategy={"max_retries": "x"},
                                 lease_until="2999-01-01T00:00:00.000000Z")
        open_step = new_job("global", [new_step("true")])
        open_step["job"][0]["retry_strategy"] = {"max_retries": "x"}
        assert all(store.write([running, open_step]))
        for doc in (running, open_step):
            manager.process(doc["_id"], store.replica.winner(doc["_id"]))
        assert manager.counts["invalid_documents"] == 1
        assert manager.skipped == {open_step["_id"]: "no valid revision"}
        assert store.replica.winner(open_step["_id"])["job"][0]["claimed_by"] is None
        assert manager.counts["handler_errors"] == 0
    finally:
        manager.pool.shutdown(1.0)


def test_a_revision_whose_leases_cannot_be_read_leaves_the_silence_seen_as_it_was(
        tmp_path: Path) -> None:
    """Another site's revision is planned on before it is validated (it may call for
    nothing here): one that breaks the reading of its leases must not make this site
    forget how long it has seen the job's lease unchanged (a revocation would wait)."""
    store = SimStore(Replica(), "reg_a")
    manager = Manager(in_tmp(SiteConfig("reg_a", CouchSettings(store.url), workers=1), tmp_path),
                      store, SITES, Journal(tmp_path / "journal"))
    try:
        doc = won_here("reg_b", "true")
        doc["job"][0]["step_status"] = "running"
        manager.periodic.note_leaves(doc["_id"], [doc])
        first, _ = manager.periodic.silences(doc["_id"], [doc])
        time.sleep(0.1)
        garbage = {**doc, "_rev": "2-a",
                   "job": [{**doc["job"][0], "lease_until": ["not", "a", "time"]}]}
        manager.process(doc["_id"], garbage)  # (a list cannot key the leases seen)
        assert doc["_id"] in manager.skipped and manager.counts["handler_errors"] == 0
        again, _ = manager.periodic.silences(doc["_id"], [doc])
        lease = doc["job"][0]["lease_until"]
        assert again[lease] >= first[lease] + 0.1  # still counted from the first sight
    finally:
        manager.pool.shutdown(1.0)


def test_planning_changes_nothing_until_the_plan_is_made(tmp_path: Path) -> None:
    """The planners are pure: what a decision notes of a job (its leases, how long its
    leaves are unchanged, its waiting) and the worker a result frees change only once
    the settler has the plan (Settler._planned), however often a plan is made."""
    store = SimStore(Replica(), "reg_a")
    manager = Manager(in_tmp(SiteConfig("reg_a", CouchSettings(store.url), workers=1), tmp_path),
                      store, SITES, Journal(tmp_path / "journal"))
    try:
        doc = {**won_here("reg_b", "true"), "_rev": "1-a"}
        doc["job"][0]["step_status"] = "running"
        key = (doc["_id"], 0)
        manager.ledger.unrecorded(key, "reg_a/w1", 1)
        decide = manager.decide_task(doc["_id"])
        record = manager.record_task(unwritten_start(doc["_id"], 0, 1, "reg_a/w1"))
        for _ in range(2):
            decide.plan([doc], [])
            record.plan([doc], [])
        assert manager.periodic.leases_seen == {}
        assert manager.ledger.run(key) == core.Running("reg_a/w1", 1)
        assert manager.pool_view().free_workers == ()
        assert manager.pool_view(key).free_workers == ("reg_a/w1",)  # what the finish sees
        manager.ledger.recorded(key, 1)
        manager.process(doc["_id"], doc)  # another site's step: nothing to do, its lease noted
        assert list(manager.periodic.leases_seen) == [doc["_id"]]
    finally:
        manager.pool.shutdown(1.0)


def won_here(site: str, command: str) -> Doc:
    doc = new_job("global", [new_step(command)])
    doc["job"][0].update(claimed_by=site, winner=site, epoch=1,
                         lease_until="2999-01-01T00:00:00.000000Z")
    return doc


def timing_settings(**settings: Any) -> dict[str, Any]:
    """A SiteConfig's `daemon` and `tuning`, each of the `settings` in its own."""
    tuning = {key: settings.pop(key) for key in list(settings) if key in SETTINGS["tuning"]}
    return {"daemon": DaemonSettings(**settings), "tuning": TuningSettings(**tuning)}


def queueing_a_win(tmp_path: Path, store: SimStore, busy_command: str = "sleep 5",
                  **settings: Any) -> tuple[Manager, Doc, Doc]:
    """reg_a with one worker: a win it started (running `busy_command`), and one it queues."""
    config = SiteConfig("reg_a", CouchSettings(store.url), workers=1,
                        **timing_settings(**settings))
    manager = Manager(in_tmp(config, tmp_path), store, SITES, Journal(tmp_path / "journal"))
    busy, queued = won_here("reg_a", busy_command), won_here("reg_a", "true")
    assert all(store.write([busy, queued]))
    manager.settle([manager.decide_task(busy["_id"]), manager.decide_task(queued["_id"])])
    assert manager.ledger.in_state(State.QUEUED) == [(queued["_id"], 0)]
    return manager, busy, queued


def test_a_queued_win_starts_on_the_next_freed_worker_without_asking_anyone(
        tmp_path: Path) -> None:
    """The queue: a win that finds every worker busy waits here, and the worker that frees
    starts it in one write, with no claim, no read of a view, no replication hop."""
    store = CountingStore(Replica(), "reg_a")
    manager, first, second = queueing_a_win(tmp_path, store, "sleep 0.3")
    try:
        assert manager.counts["action_queue"] == 1
        store.calls.clear()
        store.reads_of.clear()
        wait_for(lambda: manager.serve_once(timeout=0.05) or
                 store.replica.winner(second["_id"])["job_status"] == "success",
                 timeout=10, what="the queued win to run")
        history = [entry["event"] for entry in store.replica.winner(second["_id"])["history"]]
        assert "released" not in history and history.count("started") == 1
        # The first's end and the second's start in one write, with no read of the second.
        assert [first["_id"], second["_id"]] in store.written
        assert store.reads_of[second["_id"]] == 0
        assert not manager.ledger.in_state(State.QUEUED) and manager.counts["handler_errors"] == 0
    finally:
        manager.pool.shutdown(1.0)


def test_a_start_on_a_win_counts_as_a_claim_won_by_its_reason_code(tmp_path: Path) -> None:
    store = SimStore(Replica(), "reg_a")
    manager, _, _ = queueing_a_win(tmp_path, store, start_write_delay=0)  # written at once
    try:
        assert (manager.counts["action_start"], manager.counts["claims_won"]) == (1, 1)
    finally:
        manager.pool.shutdown(1.0)


def test_a_win_queued_for_half_its_start_by_lease_is_given_back(tmp_path: Path) -> None:
    """Its start, or its release, must reach the creator long before the creator may take
    it back: a win no worker took within half the lease goes back (core.placement.queues)."""
    store = SimStore(Replica(), "reg_a")
    manager, _, queued_win = queueing_a_win(tmp_path, store, lease=1.0, heartbeat=0.5)
    try:
        wait_for(lambda: manager.serve_once(timeout=0.05)
                 or not manager.ledger.in_state(State.QUEUED),
                 timeout=5, what="the queued win to be given back")
        step = store.replica.winner(queued_win["_id"])["job"][0]
        assert (step["winner"], step["epoch"]) == (None, 2)
        assert store.replica.winner(queued_win["_id"])["history"][-1]["reason"] == \
            Reason.NO_WORKER_IN_TIME
    finally:
        manager.pool.shutdown(1.0)


def test_a_draining_site_says_so_and_gives_its_queued_wins_back(tmp_path: Path) -> None:
    store = SimStore(Replica(), "reg_a")
    manager, _, queued_win = queueing_a_win(tmp_path, store)
    manager.drain(grace=0.5)
    assert not manager.ledger.in_state(State.QUEUED)
    step = store.replica.winner(queued_win["_id"])["job"][0]
    assert (step["winner"], step["epoch"]) == (None, 2)
    published = store.replica.winner("site-reg_a")
    assert (published["draining"], published["free_workers"]) == (True, 0)


def test_a_queued_win_whose_job_is_gone_frees_its_place(tmp_path: Path) -> None:
    store = SimStore(Replica(), "reg_a")
    manager, _, queued_win = queueing_a_win(tmp_path, store)
    try:
        rev = store.replica.winner(queued_win["_id"])["_rev"]
        assert store.write([{"_id": queued_win["_id"], "_rev": rev, "_deleted": True}])
        manager.process(queued_win["_id"])
        assert not manager.ledger.in_state(State.QUEUED)
    finally:
        manager.pool.shutdown(1.0)


class FlakyStore(SimStore):
    """A SimStore whose next `failures` reads fail as a server that does not answer."""

    failures = 0

    def read(self, ids: Iterable[str]) -> dict[str, list[Doc]]:
        if self.failures:
            self.failures -= 1
            raise Unavailable("read failed: ConnectionError: refused")
        return super().read(ids)


def creator_alone(tmp_path: Path, store: SimStore, **settings: Any) -> Manager:
    config = SiteConfig("global", CouchSettings(store.url), workers=1,
                        **timing_settings(**settings))
    return Manager(in_tmp(config, tmp_path), store, SITES, Journal(tmp_path / "journal"))


def test_a_decision_a_failed_read_lost_is_taken_again(tmp_path: Path) -> None:
    store = FlakyStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)
    try:
        job = new_job("global", [new_step("true")])
        assert all(store.write([job]))
        store.failures = 1
        manager.process(job["_id"])  # the read fails: nothing decided, nothing lost
        assert manager.counts["steps_started"] == 0 and job["_id"] in manager.settler.retry_at
        wait_for(lambda: manager.serve_once(timeout=0.05) or manager.counts["steps_started"],
                 timeout=5, what="the decision taken again")
    finally:
        manager.pool.shutdown(1.0)


def test_the_manager_wakes_to_publish_a_changed_room_once_it_settled(tmp_path: Path) -> None:
    """A room that changed while no open step waits is published SETTLE later: the
    manager's wait ends then, not at its timeout, and the status is written."""
    store = SimStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)
    try:
        manager.serve_once(timeout=0.05)  # the first status: one free worker
        assert store.replica.winner("site-global")["free_workers"] == 1
        manager.periodic.publisher.last_at -= status.MIN_INTERVAL  # published long ago
        assert manager.pool.book(("job-x", 0)) is not None  # the room changes: 1 -> 0
        wait = manager.periodic.status_wait(manager.own_status(), timeout=30.0)
        assert 0.0 < wait <= status.SETTLE
        time.sleep(wait)
        manager.serve_once(timeout=30.0)  # due now: no wait
        assert store.replica.winner("site-global")["free_workers"] == 0
    finally:
        manager.pool.shutdown(1.0)

def test_the_room_the_keep_alive_reads_is_the_free_workers_known_at_each_site(
        tmp_path: Path) -> None:
    """Manager.room_seen (core.resave_picks): our free workers, each site's free workers
    from its fresh status (a restricted site's too), None where no status was heard."""
    store = SimStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)
    try:
        manager.serve_once(timeout=0.05)
        assert manager.room_seen == {"global": 1, "reg_a": None, "reg_b": None}
        for site, free, restricted in (("reg_a", 3, False), ("reg_b", 2, True)):
            manager.periodic.hear_status(status.SiteStatus(
                site, workers=4, free_workers=free, draining=False, assigns=True,
                restricted=restricted, updated_at=format_time(datetime.now(UTC))).as_doc())
        assert manager.pool.book(("job-x", 0)) is not None
        manager.serve_once(timeout=0.05)
        assert manager.room_seen["reg_a"] is None  # refreshed once a second at most
        manager.room_seen_at -= 1.0
        manager.serve_once(timeout=0.05)
        assert manager.room_seen == {"global": 0, "reg_a": 3, "reg_b": 2}
    finally:
        manager.pool.shutdown(1.0)


def test_the_claim_delay_grows_with_the_sites_heard_of(tmp_path: Path) -> None:
    """A creator feeds the other sites in turn: among nine, each waits longer between two
    of its assignments than among three, so claims are held back longer (the fed delay
    never below the plain one)."""
    store = SimStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)
    try:
        delays = []
        for site in ("reg_a", "reg_b", *(f"reg_{n}" for n in range(3, 9))):
            manager.periodic.hear_status(status.SiteStatus(
                site, workers=2, free_workers=0, draining=False, assigns=True,
                restricted=False, updated_at=format_time(datetime.now(UTC))).as_doc())
            ctx = manager.context()
            delays.append((ctx.claim_delay, ctx.fed_claim_delay))
        assert delays[1] == (core.CLAIM_DELAY, core.FED_CLAIM_DELAY)  # three sites
        assert delays[-1] == (4 * core.CLAIM_DELAY, core.FED_CLAIM_DELAY)  # nine
        assert core.claim_delay_for(13) == 6 * core.CLAIM_DELAY > core.FED_CLAIM_DELAY
        assert [d for d, _ in delays] == sorted(d for d, _ in delays)
    finally:
        manager.pool.shutdown(1.0)


def serve_until(manager: Manager, done: Any, what: str) -> None:
    wait_for(lambda: manager.serve_once(timeout=0.05) or done(), timeout=10, what=what)


def test_a_step_that_runs_here_ends_without_a_read_of_its_job(tmp_path: Path) -> None:
    store = CountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)
    try:
        job = new_job("global", [new_step("true"), new_step("true")])
        assert all(store.write([job]))
        manager.process(job["_id"])  # read once, started on the revision read
        assert store.reads_of[job["_id"]] == 1 and manager.counts["steps_started"] == 1
        serve_until(manager, lambda: store.replica.winner(job["_id"])["job_status"],
                    "the job's end")
        # Each end (and the next start with it) was written on our own last revision.
        assert store.reads_of[job["_id"]] == 1, store.reads_of
        assert store.replica.winner(job["_id"])["job_status"] == "success"
    finally:
        manager.pool.shutdown(1.0)


def test_a_step_whose_job_is_deleted_while_it_runs_frees_its_worker(tmp_path: Path) -> None:
    """Its end has no document left to be written in: the worker is free all the same
    (the execution was kept as running, and the site never ran anything again)."""
    store = SimStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)
    try:
        gone, after = new_job("global", [new_step("sleep 0.3")]), new_job("global",
                                                                         [new_step("true")])
        assert all(store.write([gone]))
        manager.process(gone["_id"])
        assert manager.counts["steps_started"] == 1
        rev = store.replica.winner(gone["_id"])["_rev"]
        assert store.write([{"_id": gone["_id"], "_rev": rev, "_deleted": True}])
        serve_until(manager, lambda: manager.counts["steps_finished"], "the step's end")
        assert not manager.ledger.runs() and len(manager.runner.free_workers()) == 1
        assert all(store.write([after]))
        manager.process(after["_id"])
        serve_until(manager, lambda: store.replica.winner(after["_id"])["job_status"],
                    "the next job's end")
        assert manager.counts["handler_errors"] == 0
    finally:
        manager.pool.shutdown(1.0)

def test_a_scan_and_the_feed_deciding_about_one_job_take_the_feeds_revision(
        tmp_path: Path) -> None:
    """A freed worker's scan and the feed's change name the same job in one batch: one
    decision, on the revision the feed brought, with no read."""
    store = CountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)
    try:
        job = new_job("global", [new_step("true")])
        assert all(store.write([job]))
        manager.settle([manager.decide_task(job["_id"]),
                        manager.decide_task(job["_id"], store.replica.winner(job["_id"]))])
        assert manager.counts["steps_started"] == 1 and store.calls["reads"] == 0
    finally:
        manager.pool.shutdown(1.0)


def test_an_end_written_on_a_revision_that_is_no_longer_newest_is_read_and_kept(
        tmp_path: Path) -> None:
    store = CountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)
    try:
        job = new_job("global", [new_step("sleep 0.5")])
        assert all(store.write([job]))
        manager.process(job["_id"])
        assert manager.counts["steps_started"] == 1
        # Someone writes after our start, unknown to us (no feed here): a new revision
        # on the same branch, so the end's write on ours is refused with a 409.
        later = store.replica.winner(job["_id"])
        later["meta"] = {"note": "written elsewhere"}
        assert all(store.write([later]))
        serve_until(manager, lambda: store.replica.winner(job["_id"])["job_status"],
                    "the job's end")
        assert manager.counts["write_conflicts"] == 1 and store.reads_of[job["_id"]] == 2
        ended = store.replica.winner(job["_id"])
        assert ended["job_status"] == "success" and ended["meta"] == {"note": "written elsewhere"}
    finally:
        manager.pool.shutdown(1.0)


class InterposedStore(CountingStore):
    """A CountingStore where, just before the first write that starts a step, another
    site's revision lands on the same branch (`interpose`), or the server fails."""

    def __init__(self, replica: Replica, name: str) -> None:
        super().__init__(replica, name)
        self.interpose: Any = None  # edit(doc) of the revision that comes in between
        self.fail = False  # or: that write fails as a server that does not answer

    def write(self, docs: Sequence[Doc]) -> list[Written]:
        starts = [doc for doc in docs if any(
            s.get("step_status") == "running" for s in doc.get("job", []))]
        if starts and self.fail:
            self.fail = False
            raise Unavailable("write failed: ConnectionError: refused")
        if starts and self.interpose is not None:
            between = self.replica.winner(starts[0]["_id"])
            self.interpose(between)
            self.interpose = None
            assert all(super().write([between]))
        return super().write(docs)


def test_a_step_launched_ahead_whose_start_meets_a_newer_revision_runs_once(
        tmp_path: Path) -> None:
    """The start is written on the revision that came in between; the run goes on."""
    store = InterposedStore(Replica(), "global")
    manager = creator_alone(tmp_path, store, start_write_delay=0)  # written at once
    try:
        job = new_job("global", [new_step("true")])
        assert all(store.write([job]))
        store.interpose = lambda doc: doc.update(meta={"note": "written elsewhere"})
        manager.process(job["_id"])  # launched ahead; the start's write meets a 409
        assert manager.counts["write_conflicts"] == 1
        serve_until(manager, lambda: store.replica.winner(job["_id"])["job_status"],
                    "the job's end")
        ended = store.replica.winner(job["_id"])
        assert ended["job_status"] == "success" and ended["meta"] == {"note": "written elsewhere"}
        assert manager.counts["steps_started"] == 1 and not manager.counts["launches_stopped"]
        assert [e["event"] for e in ended["history"]] == ["created", "started", "finished"]
        assert len(manager.journal) == 0  # its entry went with the start's write
    finally:
        manager.pool.shutdown(1.0)


def test_a_step_launched_ahead_of_a_start_that_cannot_be_written_is_stopped(
        tmp_path: Path) -> None:
    """The server does not take the start: the run is stopped at once (nothing shows it
    running), its stop recorded, and the step runs again once the server answers."""
    store = InterposedStore(Replica(), "global")
    manager = creator_alone(tmp_path, store, start_write_delay=0)  # written at once
    try:
        job = new_job("global", [new_step("sleep 30")])
        assert all(store.write([job]))
        store.fail = True
        manager.process(job["_id"])
        assert manager.counts["launches_stopped"] == 1
        serve_until(manager, lambda: manager.counts["steps_started"] == 2, "the step again")
        history = store.replica.winner(job["_id"])["history"]
        assert [e["event"] for e in history] == ["created", "started", "released", "started"]
        assert [e["epoch"] for e in history[1:]] == [1, 2, 3]  # the stopped run: fenced off
        assert len(manager.journal) == 0  # its entry went with its report
    finally:
        manager.pool.shutdown(1.0)


def test_a_daemon_dead_before_a_start_launched_ahead_is_written_never_reuses_its_epoch(
        tmp_path: Path) -> None:
    """The journal holds the launch until its start is written: a successor records the
    run as stopped (its start included) and starts the step in a new epoch."""
    store = InterposedStore(Replica(), "global")
    manager = creator_alone(tmp_path, store, start_write_delay=0)  # written at once
    job = new_job("global", [new_step("sleep 30")])
    assert all(store.write([job]))
    store.fail = True
    manager.process(job["_id"])  # launched; the start's write fails ...
    manager.pool.shutdown(1.0)  # ... and the daemon dies before its report is recorded
    successor = creator_alone(tmp_path, store, start_write_delay=0)  # the same journal
    try:
        assert (job["_id"], 0) in successor.held
        successor.recover()
        serve_until(successor, lambda: successor.counts["steps_started"] == 1, "a new start")
        history = store.replica.winner(job["_id"])["history"]
        assert [e["event"] for e in history] == ["created", "started", "released", "started"]
        assert [e["epoch"] for e in history[1:]] == [1, 2, 3]
        assert "stopped before this start was written" in history[2]["detail"]
    finally:
        successor.pool.shutdown(1.0)


def test_a_start_decided_on_a_revision_older_than_one_seen_is_not_launched_ahead(
        tmp_path: Path) -> None:
    store = CountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)
    try:
        job = new_job("global", [new_step("true")])
        assert all(store.write([job]))
        old = store.replica.winner(job["_id"])
        newer = {**old, "meta": {"note": "written elsewhere"}}
        assert all(store.write([newer]))
        manager.revisions.depth[job["_id"]] = 2  # as the feed showed it
        manager.settle([manager.decide_task(job["_id"], known=old)])
        # Written first (a 409), never launched on the old revision; then decided again.
        assert manager.counts["write_conflicts"] == 1
        assert not manager.counts["launches_stopped"]
    finally:
        manager.pool.shutdown(1.0)


def writes_of(store: CountingStore, job_id: str) -> int:
    return sum(job_id in written for written in store.written)


def ran_once_started_once(manager: Manager, store: SimStore, job_id: str) -> None:
    """Serve until the job ends: one run, one start in its history, nothing stopped."""
    serve_until(manager, lambda: store.replica.winner(job_id)["job_status"], "the job's end")
    ended = store.replica.winner(job_id)
    assert [e["event"] for e in ended["history"]] == ["created", "started", "finished"]
    assert manager.counts["steps_started"] == 1 and not manager.counts["launches_stopped"]


def submitted(store: SimStore, command: str) -> Doc:
    """A one-step job of `global`'s, in the store."""
    job = new_job("global", [new_step(command)])
    assert all(store.write([job]))
    return job


def test_a_short_steps_start_is_written_with_its_end_in_one_revision(tmp_path: Path) -> None:
    """docs/protocol.md, "A start written with its end": one revision, not two."""
    store = CountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)
    try:
        job = submitted(store, "true")
        manager.process(job["_id"])  # launched ahead: a deferred start
        assert manager.counts["steps_started"] == 1 and writes_of(store, job["_id"]) == 1
        serve_until(manager, lambda: store.replica.winner(job["_id"])["job_status"],
                    "the job's end")
        ended = store.replica.winner(job["_id"])
        assert writes_of(store, job["_id"]) == 2  # its creation, then start and end
        assert [e["event"] for e in ended["history"]] == ["created", "started", "finished"]
        started, finished = ended["history"][1:]
        assert started["at"] == ended["job"][0]["start_time"] <= finished["at"]
        assert (started["epoch"], finished["epoch"]) == (1, 1)
        assert manager.counts["starts_deferred"] == 1 and not manager.counts["launches_stopped"]
        assert len(manager.journal) == 0 and not manager.ledger.in_state(State.DEFERRED)
    finally:
        manager.pool.shutdown(1.0)


def test_a_start_planned_on_a_revision_older_than_our_own_end_books_no_worker(
        tmp_path: Path) -> None:
    """A scan offers a step this site already ran, from the revision that still showed it
    open (its start was written with its end): the start's write meets our own end (a
    409), which the feed brings with no decision. The worker must not stay booked for
    it until the booking timeout (a burst's creator lost its workers for 60 s so)."""
    store = CountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)
    try:
        job = submitted(store, "true")
        opened = store.replica.winner(job["_id"])
        manager.process(job["_id"])
        serve_until(manager, lambda: store.replica.winner(job["_id"])["job_status"],
                    "the job's end")
        manager.settle([manager.decide_task(job["_id"], seen=opened)])
        assert manager.counts["write_conflicts"] == 1
        assert not manager.pool.bookings() and len(manager.runner.free_workers()) == 1
        ran_once_started_once(manager, store, job["_id"])
    finally:
        manager.pool.shutdown(1.0)


class TimedStore(CountingStore):
    """A CountingStore that notes when it took each write (monotonic)."""

    def __init__(self, replica: Replica, name: str) -> None:
        super().__init__(replica, name)
        self.taken_at: list[float] = []

    def write(self, docs: Sequence[Doc]) -> list[Written]:
        self.taken_at.append(time.monotonic())
        return super().write(docs)

    def taken(self, job_id: str) -> list[float]:
        """When each write with the job in it was taken."""
        return [at for at, ids in zip(self.taken_at, self.written, strict=True)
                if job_id in ids]


def in_flight_creator(tmp_path: Path, store: SimStore, writer: SlowAnswers,
                      workers: int) -> Manager:
    config = SiteConfig("global", CouchSettings(store.url), workers=workers)
    return Manager(in_tmp(config, tmp_path), store, SITES, Journal(tmp_path / "journal"),
                   writer=writer)


def test_a_step_that_ends_while_a_write_is_in_flight_is_recorded_before_its_answer(
        tmp_path: Path) -> None:
    """The manager does not idle while the server answers: a report that comes meanwhile
    is written at once, beside the write in flight (Settler.write)."""
    store, writer = TimedStore(Replica(), "global"), SlowAnswers(delay=2.0)
    manager = in_flight_creator(tmp_path, store, writer, workers=2)
    try:
        first, second = submitted(store, "true"), submitted(store, "sleep 0.5")
        manager.settle([manager.decide_task(first["_id"]), manager.decide_task(second["_id"])])
        assert manager.counts["steps_started"] == 2  # both launched, their starts held back
        ended = [first["_id"], second["_id"]]
        serve_until(manager, lambda: all(store.replica.winner(job_id)["job_status"]
                                         for job_id in ended), "both ends")
        [first_end], [second_end] = (store.taken(job_id)[1:] for job_id in ended)
        # The first end's answer took two seconds; the second end was written in them.
        assert first_end < second_end < writer.answered_at[0], (store.written,
                                                                 writer.answered_at)
        assert manager.counts["decided_while_writing"] >= 1
        assert manager.counts["handler_errors"] == 0 and not manager.held
    finally:
        manager.pool.shutdown(1.0)


def test_a_report_about_a_job_whose_write_is_in_flight_waits_for_its_answer(
        tmp_path: Path) -> None:
    """A step ends while the write of its start (deferred, fallen due) is in flight: its
    end is planned on what that write says, once it says it, so the job's revisions are
    written in order and none is lost."""
    store, writer = TimedStore(Replica(), "global"), SlowAnswers(delay=1.0)
    manager = in_flight_creator(tmp_path, store, writer, workers=1)
    try:
        job = submitted(store, "sleep 1.5")  # its start due after start_write_delay, 1 s
        manager.process(job["_id"])
        serve_until(manager, lambda: store.replica.winner(job["_id"])["job_status"],
                    "the job's end")
        ended = store.replica.winner(job["_id"])
        assert [e["event"] for e in ended["history"]] == ["created", "started", "finished"]
        # The start went out, the end after its answer.
        start, end = store.taken(job["_id"])[1:]
        assert start < writer.answered_at[0] <= end
        assert ended["job_status"] == "success" and manager.counts["steps_started"] == 1
        assert manager.counts["reports_waited"] >= 1  # the end came in flight
        assert manager.counts["handler_errors"] == 0
    finally:
        manager.pool.shutdown(1.0)


def test_a_chained_start_whose_answer_is_lost_is_released_and_run_once(tmp_path: Path) -> None:
    """docs/protocol.md, "Launch ahead": a start chained onto an end is launched once that
    write is answered. The server takes the end and the chained start, but the answer is
    lost: the start, recorded with no run behind it, is released, and the step runs
    once, in a new epoch."""
    store = OutageStore(Replica(), "global")
    manager = creator_alone(tmp_path, store, start_write_delay=0.0)
    try:
        job = new_job("global", [new_step("sleep 0.3"), new_step("true")])
        assert all(store.write([job]))
        manager.process(job["_id"])
        store.answers_lost = True  # when step 0 ends
        serve_until(manager, lambda: manager.held, "the end held")
        assert manager.ledger.run((job["_id"], 1)) is None  # nothing launched
        store.answers_lost = False
        serve_until(manager, lambda: store.replica.winner(job["_id"])["job_status"],
                    "the job's end")
        doc = store.replica.winner(job["_id"])
        [lost, ran] = [epoch for step, epoch, _ in started(doc) if step == 1]
        assert released_after(doc, WORKER_LOST) == {(1, lost)} and ran > lost
        assert [(e["step"], e["epoch"]) for e in doc["history"] if e["event"] == "finished"] \
            == [(0, 1), (1, ran)]
        assert manager.counts["steps_started"] == 2 and not manager.counts["launches_stopped"]
        assert manager.counts["handler_errors"] == 0 and not manager.held
    finally:
        manager.pool.shutdown(1.0)


def test_an_end_whose_answer_is_lost_is_found_written_not_called_stale(tmp_path: Path) -> None:
    """The server takes a step's end, its answer is lost: the held result, tried again,
    finds its end in the history and writes nothing (no `stale_finish` saying that a run
    which counted did not)."""
    store = OutageStore(Replica(), "global")
    manager = creator_alone(tmp_path, store, start_write_delay=0.0)
    try:
        job = new_job("global", [new_step("sleep 0.3"), new_step("true", target="reg_a")])
        assert all(store.write([job]))
        manager.process(job["_id"])
        store.answers_lost = True  # when step 0 ends
        serve_until(manager, lambda: manager.held, "the end held")
        store.answers_lost = False
        serve_until(manager, lambda: not manager.held, "the held end settled")
        events = [e["event"] for e in store.replica.winner(job["_id"])["history"]]
        assert events.count("finished") == 1 and "stale_finish" not in events, events
    finally:
        manager.pool.shutdown(1.0)


def test_a_chained_run_notes_the_end_it_followed(tmp_path: Path) -> None:
    """Its report is a stale finish should that end not count (core.late_start)."""
    store = CountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)
    try:
        job = new_job("global", [new_step("true"), new_step("sleep 5")])
        assert all(store.write([job]))
        manager.process(job["_id"])
        serve_until(manager, lambda: manager.pool.is_busy((job["_id"], 1)), "step 1 to run")
        end = store.replica.winner(job["_id"])["job"][0]["finish_time"]
        run = manager.ledger.run((job["_id"], 1))
        assert end is not None and run is not None and run.after == end
    finally:
        manager.pool.shutdown(0.0)


def test_a_step_still_running_when_the_delay_is_up_has_its_start_written_then(
        tmp_path: Path) -> None:
    """Written late, the start records when the step was launched; its lease runs from
    the write."""
    store = CountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store, start_write_delay=0.3)
    try:
        job = submitted(store, "sleep 1")
        launched = time.time()
        manager.process(job["_id"])
        assert store.replica.winner(job["_id"])["job"][0]["step_status"] is None
        serve_until(manager, lambda: store.replica.winner(job["_id"])["job"][0]["step_status"],
                    "the start's write")
        written = time.time()
        assert written - launched >= 0.3
        doc = store.replica.winner(job["_id"])
        step = doc["job"][0]
        start = datetime.fromisoformat(step["start_time"]).timestamp()
        assert launched - 0.05 <= start <= launched + 0.2, (launched, step["start_time"])
        assert (step["winner"], step["epoch"], step["executioner"]) == ("global", 1, "global/w1")
        assert [e["event"] for e in doc["history"]] == ["created", "started"]
        serve_until(manager, lambda: store.replica.winner(job["_id"])["job_status"],
                    "the job's end")
        assert writes_of(store, job["_id"]) == 3 and manager.counts["steps_started"] == 1
    finally:
        manager.pool.shutdown(1.0)


@pytest.mark.parametrize("answers_lost", [False, True])
def test_a_start_due_while_the_server_is_down_is_written_once_it_is_back(
        tmp_path: Path, answers_lost: bool) -> None:
    """The run goes on (stopping it would run the step twice), its start tried again; a
    write the server took but never answered is found written (the retry's 409)."""
    store = OutageStore(Replica(), "global")
    manager = creator_alone(tmp_path, store, start_write_delay=0.2)
    try:
        job = submitted(store, "sleep 1.5")
        manager.process(job["_id"])
        store.down, store.answers_lost = not answers_lost, answers_lost
        until = time.monotonic() + 0.8  # the start due, and tried again, while down
        serve_until(manager, lambda: time.monotonic() > until, "the outage's end")
        assert manager.pool.is_busy((job["_id"], 0)) and not manager.counts["launches_stopped"]
        store.down = store.answers_lost = False
        ran_once_started_once(manager, store, job["_id"])
    finally:
        manager.pool.shutdown(1.0)


def test_a_decision_about_a_job_whose_start_waits_writes_that_start_first(
        tmp_path: Path) -> None:
    """Another site's write meanwhile: the start goes on top of it at once, the run goes on."""
    store = CountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store, start_write_delay=10.0)
    try:
        job = submitted(store, "sleep 0.5")
        manager.process(job["_id"])
        between = store.replica.winner(job["_id"])
        between["meta"] = {"note": "written elsewhere"}
        assert all(store.write([between]))
        manager.process(job["_id"])  # as the feed would have it decided
        doc = store.replica.winner(job["_id"])
        assert doc["job"][0]["step_status"] == "running" and doc["meta"] == between["meta"]
        ran_once_started_once(manager, store, job["_id"])
    finally:
        manager.pool.shutdown(1.0)


def test_a_run_launched_after_an_end_a_revocation_superseded_is_a_stale_finish(
        tmp_path: Path) -> None:
    """docs/protocol.md, "Only after the end it followed": the creator launches step 1
    once step 0's end (reg_b's, epoch 1) is in; before the start is written, step 0 is
    found revoked and run again (reg_a, epoch 3) and step 1 open again in the same
    epoch. The run is stopped, and its end, though it says nothing of its launch entry
    any more, is recorded as a stale finish: never started before the end that counts.
    Step 1 then runs in a new epoch."""
    store = CountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store, start_write_delay=10.0)
    try:
        job = new_job("global", [new_step("true"), new_step("sleep 5")])
        job["job"][0].update(step_status="finished", claimed_by="reg_b", winner="reg_b",
                             epoch=1, executioner="reg_b/w1", exit_code=0,
                             start_time="2026-11-28T00:00:00.000000Z",
                             finish_time="2026-11-28T00:00:01.000000Z")
        job["step"] = 1
        assert all(store.write([job]))
        manager.process(job["_id"])  # launched ahead, its start held back
        assert manager.counts["steps_started"] == 1 and manager.ledger.in_state(State.DEFERRED)
        rerun = store.replica.winner(job["_id"])
        rerun["job"][0].update(claimed_by="reg_a", winner="reg_a", epoch=3,
                               executioner="reg_a/w1", finish_time="2026-11-28T00:00:09Z")
        assert all(store.write([rerun]))  # as the merge of the creator's branch shows it
        manager.process(job["_id"])  # the feed's news: the run is stopped
        serve_until(manager, lambda: manager.counts["launches_stopped"]
                    and manager.ledger.run((job["_id"], 1)) is None
                    and store.replica.winner(job["_id"])["job"][1]["epoch"] >= 1,
                    "the stopped run recorded")
        doc = store.replica.winner(job["_id"])
        events = [(entry["event"], entry["step"], entry["epoch"]) for entry in doc["history"]]
        assert ("started", 1, 1) not in events, doc["history"]
        assert ("stale_finish", 1, 1) in events, doc["history"]
        # Its epoch burned: a next run of step 1 is in a new one.
        assert all(epoch >= 2 for name, step, epoch in events if (name, step) == ("started", 1))
        assert manager.counts["handler_errors"] == 0
    finally:
        manager.pool.shutdown(1.0)


def test_a_won_steps_start_is_written_with_its_end_too(tmp_path: Path) -> None:
    store = CountingStore(Replica(), "reg_a")
    manager = Manager(in_tmp(SiteConfig("reg_a", CouchSettings(store.url), workers=1), tmp_path),
                      store, SITES, Journal(tmp_path / "journal"))
    try:
        job = won_here("reg_a", "true")
        assert all(store.write([job]))
        manager.process(job["_id"])
        serve_until(manager, lambda: store.replica.winner(job["_id"])["job_status"],
                    "the job's end")
        ended = store.replica.winner(job["_id"])
        assert writes_of(store, job["_id"]) == 2 and ended["job_status"] == "success"
        assert [(e["event"], e["site"], e["epoch"]) for e in ended["history"]] == [
            ("created", "global", 0), ("started", "reg_a", 1), ("finished", "reg_a", 1)]
    finally:
        manager.pool.shutdown(1.0)


def test_a_cancel_while_a_start_waits_stops_the_run_at_once(tmp_path: Path) -> None:
    store = CountingStore(Replica(), "global")
    manager = creator_alone(tmp_path, store, start_write_delay=10.0)
    try:
        job = submitted(store, "sleep 30")
        manager.process(job["_id"])
        assert manager.pool.is_busy((job["_id"], 0))
        cancel = core.plan_cancel([store.replica.winner(job["_id"])], manager.context(), "test")
        assert cancel.doc is not None and all(store.write([cancel.doc]))
        cancelled = time.monotonic()
        manager.process(job["_id"])  # as the feed would have it decided
        serve_until(manager, lambda: not manager.pool.is_busy((job["_id"], 0))
                    and not manager.ledger.runs(), "the run stopped")
        assert time.monotonic() - cancelled < 5.0  # not at the delay's end
        assert manager.counts["launches_stopped"] == 1
        assert not manager.ledger.in_state(State.DEFERRED)
        doc = store.replica.winner(job["_id"])
        assert doc["job_status"] == "cancelled"
        assert [(e["event"], e["epoch"]) for e in doc["history"] if e["site"] == "global"
                and e.get("worker")] == [("cancelled", 1)]  # the run, recorded
    finally:
        manager.pool.shutdown(1.0)


def test_a_start_the_server_does_not_take_for_long_is_stopped(tmp_path: Path) -> None:
    """Held back no longer than half the lease (or the creator timeout): past that a
    successor could adopt the job and start the step in the very epoch of our run."""
    store = OutageStore(Replica(), "global")
    manager = creator_alone(tmp_path, store, lease=2.0, heartbeat=1.0, start_write_delay=0.2)
    try:
        job = submitted(store, "sleep 30")
        manager.process(job["_id"])
        store.down = True
        serve_until(manager, lambda: manager.counts["launches_stopped"], "the run stopped")
        store.down = False
        serve_until(manager, lambda: manager.counts["steps_started"] == 2, "a new start")
        history = store.replica.winner(job["_id"])["history"]
        assert [(e["event"], e["epoch"]) for e in history[:3]] == [
            ("created", 0), ("started", 1), ("released", 2)]
    finally:
        manager.pool.shutdown(1.0)


def test_a_creator_whose_own_booking_expires_assigns_the_waiting_claim(tmp_path: Path) -> None:
    """Its direct start lost to another site's claim; once the booking is given back the
    creator decides again at once: the claim must not wait for a change that never comes."""
    store = SimStore(Replica(), "global")
    manager = creator_alone(tmp_path, store, booking_timeout=0.01)
    try:
        job = new_job("global", [new_step("true")])
        job["job"][0]["claimed_by"] = "reg_a"
        assert all(store.write([job]))
        manager.runner.apply(core.Book((job["_id"], 0), "global/w1"))
        time.sleep(0.02)
        manager.process(job["_id"])
        step = store.replica.winner(job["_id"])["job"][0]
        assert (step["winner"], step["epoch"]) == ("reg_a", 1)
        assert not manager.pool.bookings()
    finally:
        manager.pool.shutdown(1.0)


def test_a_free_worker_takes_open_steps_in_line_order_where_waiting_counts(
        tmp_path: Path) -> None:
    """core.claim_rank: ten seconds of waiting are worth one priority level. A job of
    priority 0 that waited 30 s goes before a new one of priority 1 (pure priority
    would starve it), and one that waited 40 s after a new one of priority 5."""
    store = SimStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)
    now = datetime.now(UTC)
    # Ages in whole tens of seconds: the ranks differ by exact levels, whatever the clock.
    ages_and_priorities = {"old-low": (30, 0), "new-high": (0, 1), "new-urgent": (0, 5),
                           "older-low": (40, 0)}
    try:
        jobs = {name: new_job("global", [new_step("true")], priority=priority,
                              created_at=format_time(now - timedelta(seconds=age)))
                for name, (age, priority) in ages_and_priorities.items()}
        assert all(store.write(list(jobs.values())))
        wait_for(lambda: manager.serve_once(timeout=0.05) or all(
            store.replica.winner(job["_id"])["job_status"] == "success"
            for job in jobs.values()), timeout=20, what="every job ended")
        start_of = {name: store.replica.winner(job["_id"])["job"][0]["start_time"]
                    for name, job in jobs.items()}
        assert sorted(start_of, key=start_of.__getitem__) == [
            "new-urgent", "older-low", "old-low", "new-high"]
    finally:
        manager.pool.shutdown(1.0)


def test_progress_is_written_within_seconds_at_most_once_per_interval_never_per_line(
        tmp_path: Path) -> None:
    """A step prints a progress line every 10 ms for 4 s: the document shows progress
    within a few seconds, the site writes it at most once every PROGRESS_INTERVAL
    (the lease renewed in the same revision), and the finish keeps the last value."""
    store = SimStore(Replica(), "global")
    manager = creator_alone(tmp_path, store)  # a heartbeat every 15 s: none due here
    command = ("for i in $(seq 100 499); do echo \"JOBDIST_PROGRESS 0.$i line $i\"; "
               "sleep 0.01; done")
    try:
        job = new_job("global", [new_step(command)])
        assert all(store.write([job]))
        began = time.monotonic()

        def step() -> Doc:
            manager.serve_once(timeout=0.05)
            return store.replica.winner(job["_id"])["job"][0]

        wait_for(lambda: step()["progress"], timeout=3, what="the first progress")
        assert time.monotonic() - began < 3
        wait_for(lambda: step()["step_status"] == "finished", timeout=30, what="the end")
        took = time.monotonic() - began
        final = store.replica.winner(job["_id"])
        revisions = int(final["_rev"].split("-")[0])
        # The submission, the start, the finish, and the progress writes: the first at
        # once, then one per interval at most (400 lines printed).
        assert 4 <= revisions <= 3 + 1 + took / PROGRESS_INTERVAL, (revisions, took)
        last = final["job"][0]["progress"]
        assert (last["fraction"], last["message"]) == (0.499, "line 499")
    finally:
        manager.pool.shutdown(1.0)


# --- automatic creator succession ---------------------------------------------------------

CREATOR_TIMEOUT = 4.0
SUCCESSION = dict(
    succession=SuccessionSettings({"global": ("reg_a", "reg_b")}, creator_timeout=CREATOR_TIMEOUT),
    **timing_settings(lease=2.0, heartbeat=0.5, clock_skew_margin=0.5, booking_timeout=0.5))


def adoptions(doc: Doc) -> list[tuple[str, int]]:
    return [(entry["site"], entry["epoch"]) for entry in doc["history"]
            if entry["event"] == "adopted"]


@pytest.mark.parametrize("dead", [{"global"}, {"global", "reg_a"}], ids=["creator", "and-first"])
def test_a_silent_creator_is_succeeded_by_the_first_successor_heard(
        tmp_path: Path, dead: set[str]) -> None:
    """The creator (then its first successor too) is gone before it decides anything: after
    creator_timeout the next site of the line takes its jobs over, and they all end."""
    world = World(tmp_path, seed=4, **SUCCESSION)
    try:
        world.serve()  # every site publishes its status once, and hears the others'
        ids = world.submit([[new_step("true", target=target) for target in ("any", "reg_b")]
                            for _ in range(6)])
        for _ in range(3):
            world.replicate()
        world.dead = dead
        started_at = time.monotonic()
        docs = world.run(ids, timeout=30.0)
        heir = "reg_b" if "reg_a" in dead else "reg_a"
        assert time.monotonic() - started_at >= CREATOR_TIMEOUT
        for doc in docs.values():
            assert doc["job_status"] == "success" and doc["creator"] == heir
            assert adoptions(doc) == [(heir, 1)]
            assert [step for step, _, _ in started(doc)] == [0, 1]  # each step once
    finally:
        world.stop()


def test_a_job_ended_by_a_dead_successor_under_a_live_winning_leaf_is_cleaned(
        tmp_path: Path) -> None:
    """reg_a took the job over and ended it, then died with global before cleaning the
    conflict: global's branch, longer (lease renewals), is CouchDB's winner and still
    live. reg_b, the next of the line, takes the job over and ends it in every view,
    running nothing (the sites of the decision core build the two branches)."""
    clock, ledger = Clock(), list[Execution]()
    sims = {name: SimSite(name, 1, clock, ledger, frozenset(SITES), lease=15.0)
            for name in SITES}
    job = new_job("global", [new_step("true"), new_step("true")], created_at=clock.now())
    assert sims["global"].replica.write(job)
    sims["global"].process(job["_id"])  # starts step 0
    sims["global"].finish((job["_id"], 0))  # and chains step 1
    sims["reg_a"].replica.pull(sims["global"].replica, job["_id"])
    for _ in range(5):
        clock.seconds += 5.0
        sims["global"].heartbeat()
    sims["reg_a"].successors = {"global": ("reg_a", "reg_b")}
    sims["reg_a"].silent = frozenset({"global"})
    sims["reg_a"].process(job["_id"])  # adopts, revokes global's lease, starts step 1
    sims["reg_a"].finish((job["_id"], 1))

    world = World(tmp_path, seed=6, **SUCCESSION)
    try:
        replica = world.stores["reg_b"].replica
        for gone in ("global", "reg_a"):
            replica.pull(sims[gone].replica, job["_id"])
        assert replica.winner(job["_id"])["job_status"] is None  # global's branch
        assert core.merge(replica.live_leaves(job["_id"]))["job_status"] == "success"
        world.dead = {"global", "reg_a"}
        doc = world.run([job["_id"]], timeout=30.0)[job["_id"]]
        assert doc["creator"] == "reg_b" and adoptions(doc) == [("reg_a", 1), ("reg_b", 2)]
        assert len(replica.live_leaves(job["_id"])) == 1
        assert started(doc) == [(0, 1, "global"), (1, 1, "global"), (1, 3, "reg_a")]
    finally:
        world.stop()


def test_an_adopted_job_that_ended_under_a_live_winning_leaf_is_cleaned(tmp_path: Path) -> None:
    """reg_b, the creator, revoked global's lease and re-saved the reopened step while
    global's run ended the job on its branch; reg_b died before it saw that branch. The
    operator adopts at global as `jobdist adopt` does (it writes the plan's revision
    only): every view shows the job ended, and global's manager, now the creator,
    deletes the other leaf. Nothing runs again."""
    clock, ledger = Clock(), list[Execution]()
    sims = {name: SimSite(name, 1, clock, ledger, frozenset(SITES), lease=15.0)
            for name in ("global", "reg_b")}
    job = new_job("reg_b", [new_step("true", target="global")], created_at=clock.now())
    doc_id = job["_id"]
    assert sims["reg_b"].replica.write(job)
    sims["global"].replica.pull(sims["reg_b"].replica, doc_id)
    sims["global"].process(doc_id)  # the step's one target starts it
    sims["reg_b"].replica.pull(sims["global"].replica, doc_id)
    sims["global"].finish((doc_id, 0))  # the job succeeds on global's branch
    clock.seconds += 22.0
    assert sims["reg_b"].process(doc_id) == "revoke"
    clock.seconds += 10.0
    resaved = core.keepalive(sims["reg_b"].replica.live_leaves(doc_id), sims["reg_b"].ctx(),
                             stale_after=5.0)
    assert resaved is not None and sims["reg_b"].replica.write(resaved)

    world = World(tmp_path, seed=7)
    try:
        replica = world.stores["global"].replica
        for sim in sims.values():
            for alive in (replica, world.stores["reg_a"].replica):
                alive.pull(sim.replica, doc_id)
        assert replica.winner(doc_id)["job_status"] is None  # reg_b's branch
        plan = core.plan_adopt(replica.live_leaves(doc_id),
                               core.Context("global", format_time(datetime.now(UTC))),
                               "reg_b", "reg_b is gone")
        assert plan.doc is not None and world.stores["global"].write([plan.doc])
        world.dead = {"reg_b"}
        doc = world.run([doc_id], timeout=30.0)[doc_id]
        assert (doc["job_status"], doc["creator"]) == ("success", "global")
        assert len(replica.live_leaves(doc_id)) == 1  # global deleted the other leaf
        assert started(doc) == [(0, 1, "global")]
    finally:
        world.stop()


def test_a_creator_back_stays_out_of_adopted_jobs_and_keeps_its_new_ones(tmp_path: Path) -> None:
    world = World(tmp_path, seed=5, **SUCCESSION)
    try:
        world.serve()
        ids = world.submit([[new_step("true")] for _ in range(4)])
        for _ in range(3):
            world.replicate()
        world.dead = {"global"}
        adopted = world.run(ids, timeout=30.0)
        assert {doc["creator"] for doc in adopted.values()} == {"reg_a"}
        world.dead = set()  # back: it hears the others, they hear it
        fresh = world.submit([[new_step("true", target=target)] for target in ("reg_a", "any")])
        docs = world.run(ids + fresh, timeout=30.0)
        for doc_id in fresh:
            assert docs[doc_id]["creator"] == "global" and adoptions(docs[doc_id]) == []
        for doc_id in ids:
            assert adoptions(docs[doc_id]) == [("reg_a", 1)]  # not taken back
    finally:
        world.stop()


# --- broadcast steps (docs/protocol.md, "Broadcast steps") ----------------------------

def sub_runs_started(doc: Doc, index: int) -> list[tuple[int, str]]:
    """The executions the history records for a step: (epoch, site)."""
    return [(epoch, site) for step, epoch, site in started(doc) if step == index]


def test_a_broadcast_step_runs_once_at_every_site_then_the_next_step(world: World) -> None:
    """The nightly-backup shape: snapshot at every site, then verify at global; sites
    start their parts on sight, the creator ends the step when the last one is done."""
    ids = world.submit([[new_step("true", target="all"), new_step("true", target="global")]
                        for _ in range(8)], creator="reg_a")
    ids += world.submit([[new_step("true", target=["global", "reg_b"], each=True)]
                         for _ in range(8)])
    docs = world.run(ids)
    for doc in docs.values():
        assert doc["job_status"] == "success", doc["history"]
        broadcast = doc["job"][0]
        expected = set(SITES) if broadcast["target"] == "all" else {"global", "reg_b"}
        assert sorted(site for _, site in sub_runs_started(doc, 0)) == sorted(expected)
        assert {site: run["status"] for site, run in broadcast["runs"].items()} == \
            dict.fromkeys(expected, "finished")
        assert all(run["exit_code"] == 0 and run["attempts"] == 1
                   for run in broadcast["runs"].values())
        if len(doc["job"]) > 1:  # verify ran once, after every snapshot finished
            assert sub_runs_started(doc, 1) == [(1, "global")]
            ends = [e["at"] for e in doc["history"] if e["event"] == "finished"
                    and e["step"] == 0]
            verify = next(e for e in doc["history"] if e["event"] == "started"
                          and e["step"] == 1)
            assert max(ends) <= verify["at"]
    for manager in world.managers.values():
        assert manager.counts["handler_errors"] == 0


@pytest.mark.parametrize("policy", ["all", "any"])
def test_a_site_failing_its_part_decides_the_step_by_its_policy(tmp_path: Path,
                                                                policy: str) -> None:
    world = World(tmp_path, seed=5)
    try:
        fails_at_b = 'test "$JOBDIST_SITE" != reg_b'
        ids = world.submit([[new_step(fails_at_b, target="all", each_policy=policy,
                                      max_retries=1),
                             new_step("true", target="global")] for _ in range(4)])
        docs = world.run(ids)
    finally:
        world.stop()
    for doc in docs.values():
        runs = doc["job"][0]["runs"]
        assert runs["reg_b"]["status"] == "failed" and runs["reg_b"]["attempts"] == 2
        assert runs["reg_b"]["exit_code"] == 1
        if policy == "all":
            assert doc["job_status"] == "failed"
            assert doc["job"][0]["step_status"] == "failed"
            assert any(e["event"] == "failed" and e["site"] == "global"
                       and "failed at reg_b" in e["detail"] for e in doc["history"])
        else:
            assert doc["job_status"] == "success"
            assert {runs[site]["status"] for site in ("global", "reg_a")} == {"finished"}


def test_a_silent_site_is_revoked_runs_again_when_back_or_is_dropped(tmp_path: Path) -> None:
    """reg_b stops replicating mid-part: the creator revokes its lease (a new epoch for
    reg_b alone); back, reg_b kills the stale run and runs its part again. Then reg_b
    goes silent for good on a second job, and an operator drops it at the creator."""
    world = World(tmp_path, seed=6, **SUCCESSION)
    try:
        world.serve()
        (first,) = world.submit([[new_step("sleep 1", target="all")]])
        deadline = time.monotonic() + 10
        while sub_runs(core.merge(world.stores["global"].replica.live_leaves(first))["job"][0]
                       ).get("reg_b", {}).get("status") != "running":
            assert time.monotonic() < deadline, "the creator never saw reg_b start its part"
            world.replicate()
            world.feed()
            world.serve()
            time.sleep(0.01)
        world.dead = {"reg_b"}
        deadline = time.monotonic() + 20
        while not any(e["event"] == "released" for e in
                      core.merge(world.stores["global"].replica.live_leaves(first))["history"]):
            assert time.monotonic() < deadline, "the creator never revoked reg_b's lease"
            world.replicate()
            world.feed()
            world.serve()
            time.sleep(0.05)
        world.dead = set()
        doc = world.run([first], timeout=30)[first]
        assert doc["job_status"] == "success"
        assert [epoch for epoch, site in sub_runs_started(doc, 0) if site == "reg_b"] == [1, 3]
        assert doc["job"][0]["runs"]["reg_b"]["epoch"] == 3
        assert doc["job"][0]["runs"]["global"]["epoch"] == 1  # the others kept theirs

        world.dead = {"reg_b"}
        (second,) = world.submit([[new_step("true", target="all")]])
        deadline = time.monotonic() + 10
        while True:
            world.replicate()
            world.feed()
            world.serve()
            merged = core.merge(world.stores["global"].replica.live_leaves(second))
            runs = sub_runs(merged["job"][0])
            if runs and all(runs[s]["status"] == "finished" for s in ("global", "reg_a")):
                break
            assert time.monotonic() < deadline, merged["history"]
            time.sleep(0.01)
        assert merged["job_status"] is None  # waits for reg_b
        plan = core.plan_drop(world.stores["global"].replica.live_leaves(second),
                              world.managers["global"].context(), "reg_b", "lost for good")
        assert plan.doc is not None and world.stores["global"].write([plan.doc])
        doc = world.run([second], timeout=10)[second]
        assert doc["job_status"] == "success" and doc["job"][0]["dropped"] == ["reg_b"]
        assert any(e["event"] == "dropped" and e["detail"] == "reg_b: lost for good"
                   for e in doc["history"])
    finally:
        world.stop()


# --- waiting jobs: woken by the feed and a timer, decided by their creator -------------

def quiet_scans(world: World) -> None:
    """No periodic re-check of waiting jobs during the test: only the feed (a job that
    ended) and the timer (not_before) may wake them."""
    for manager in world.managers.values():
        manager.periodic.last_scans["waiting"] = time.monotonic()


def events_named(doc: Doc, name: str) -> list[Doc]:
    return [entry for entry in doc["history"] if entry["event"] == name]


def test_a_job_waits_for_a_job_of_another_site_and_is_woken_when_it_ends(world: World) -> None:
    quiet_scans(world)
    awaited = new_job("reg_a", [new_step("sleep 0.5", target="reg_a")])
    waiter = new_job("global", [new_step("true")], waits={"after": [awaited["_id"]]})
    assert all(world.stores["reg_a"].write([awaited]))
    assert all(world.stores["global"].write([waiter]))
    docs = world.run([awaited["_id"], waiter["_id"]], timeout=30)
    done, finished = docs[waiter["_id"]], events_named(docs[awaited["_id"]], "finished")
    assert done["job_status"] == "success", done["history"]
    (ready,) = events_named(done, "ready")
    assert ready["site"] == "global"
    assert ready["detail"] == f"released from wait: {awaited['_id']} success"
    assert ready["at"] >= finished[0]["at"]
    assert [entry["at"] >= ready["at"] for entry in events_named(done, "started")] == [True]


@pytest.mark.parametrize(("policy", "expected"), [(None, "failed"), ("always", "success")])
def test_a_failed_awaited_job_fails_the_waiting_one_unless_it_runs_always(
        world: World, policy: str | None, expected: str) -> None:
    quiet_scans(world)
    awaited = new_job("reg_b", [new_step("false", target="reg_b")])
    waits: Doc = {"after": [awaited["_id"]], **({"after_policy": policy} if policy else {})}
    waiter = new_job("global", [new_step("true")], waits=waits)
    assert all(world.stores["reg_b"].write([awaited]))
    assert all(world.stores["global"].write([waiter]))
    docs = world.run([awaited["_id"], waiter["_id"]], timeout=30)
    done = docs[waiter["_id"]]
    assert done["job_status"] == expected, done["history"]
    if expected == "failed":
        assert events_named(done, "started") == []
        assert events_named(done, "failed")[-1]["detail"] == \
            f"waited for {awaited['_id']}, which failed"
    else:
        assert len(events_named(done, "started")) == 1


def test_a_delayed_job_starts_at_its_time_woken_by_the_timer(world: World) -> None:
    quiet_scans(world)
    not_before = format_time(datetime.now(UTC) + timedelta(seconds=1.5))
    waiter = new_job("global", [new_step("true")], waits={"not_before": not_before})
    assert all(world.stores["global"].write([waiter]))
    docs = world.run([waiter["_id"]], timeout=30)
    (start,) = events_named(docs[waiter["_id"]], "started")
    assert start["at"] >= not_before
    assert world.managers["global"].waiting.wake_due == {}


def test_a_job_waiting_for_a_job_not_there_yet_starts_once_it_arrives_and_ends(
        world: World) -> None:
    quiet_scans(world)
    later_job = new_job("reg_b", [new_step("true", target="reg_b")])
    waiter = new_job("global", [new_step("true")], waits={"after": [later_job["_id"]]})
    assert all(world.stores["global"].write([waiter]))
    for _ in range(30):
        world.replicate()
        world.feed()
        world.serve()
        time.sleep(0.01)
    for store in world.stores.values():  # every site sees it waiting, nobody took it
        doc = store.replica.winner(waiter["_id"])
        assert doc is not None and doc["job_status"] is None and doc["history"][-1]["event"] \
            == "created"
        assert store.waiting("global") == [waiter["_id"]]
    assert all(world.stores["reg_b"].write([later_job]))
    docs = world.run([later_job["_id"], waiter["_id"]], timeout=30)
    assert docs[waiter["_id"]]["job_status"] == "success"


def test_a_job_past_its_time_still_waiting_for_a_job_is_not_decided_again_and_again(
        world: World) -> None:
    quiet_scans(world)
    not_before = format_time(datetime.now(UTC) + timedelta(seconds=0.3))
    waiter = new_job("global", [new_step("true")],
                     waits={"not_before": not_before, "after": ["job-later"]})
    assert all(world.stores["global"].write([waiter]))
    for _ in range(20):
        world.feed()
        world.serve()
        time.sleep(0.05)
    reads = world.stores["global"].calls["reads"]
    for _ in range(20):  # its time has passed: nothing but a job ending may wake it now
        world.serve()
        time.sleep(0.05)
    assert world.stores["global"].calls["reads"] == reads
    assert world.managers["global"].waiting.wake_heap == []
    assert world.stores["global"].replica.winner(waiter["_id"])["job_status"] is None
