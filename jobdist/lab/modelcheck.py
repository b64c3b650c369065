"""Exhaustive search of the safety path on a small model: every interleaving, not a sample.

The model is the simulator of `jobdist.lab.sim`: three sites, each deciding with the
real pure core (`jobdist.core`, the functions the daemon calls) on its own replica,
the replicas a model of CouchDB's revision trees. One job of two steps (a plain step
on `any`, then a broadcast step to every site), created at `global`, with the
succession line of three sites the simulations use. A transition is one event:

- `process S`: site S reports its killed runs, then decides on its replica;
- `replicate A B`: B pulls the job from A (only over a link that is up, and only
  when something is new to B);
- `finish S k`: a worker of S ends the run of step k;
- `suspect A B` / `hear A B`: A comes to believe B silent (the link between them is
  cut) or hears B again (the link is up); the belief lags the link, as a status does;
- faults, at most K of them: `cut A B`, `heal A B`, `silence S` (every link of S
  cut at once: a creator gone quiet), `restart S` (its daemon: runs and bookings
  lost), `expire` (the clock jumps past a lease plus the skew margin; every site
  renews the leases of its runs, as its heartbeat does).

At every state reached: no two runs share a (step, epoch, site) token; no step is
counted twice (the runs that ended it and that the merged history does not explain
away are one per step, one per site and step for a broadcast step); every run is
counted, still in flight, lost in a crash, or explained by the merged history
(`audit.why_superseded`, as `sim.check_duplicates_explained`); a job that ended
counts only runs that ran. "Merged" is the merge of the union of every replica's
revisions: what every site sees once replication has caught up.

States are hashed canonically: a replica is the set of its revision ids (each a
digest of its parent and content, as CouchDB's), a site's local state its bookings,
runs, queue and beliefs; the clock only moves by `expire`, so it is the number of
those. A state reached again with no fewer faults left is not expanded again.

Why a search of our own rather than a model checker library: the point is to run
the real decision core, and no well-kept checker explores Python code directly
(PyPI has none; TLA+/Apalache, NuSMV and the like check a model written in their
own language, which would be a second copy of the core to keep in step). Over a
deterministic simulator a breadth-first search with a visited set is a page of
code, and breadth-first gives a shortest counterexample, printed as a schedule
that `replay` runs again.
"""

from __future__ import annotations

import collections
import itertools
import pickle
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from jobdist import core
from jobdist.model import Job, is_broadcast, new_job, new_step

from .audit import counted, why_superseded
from .sim import Clock, Execution, Replica, SimSite

SITES = ("global", "reg_a", "reg_b")
LINES = {"global": ("reg_a", "reg_b"), "reg_a": ("reg_b", "global"), "reg_b": ("global",)}
JOB = "job-000"
LEASE = 15.0
EXPIRY_JUMP = 25.0  # past a lease (15 s) and the skew margin (5 s) that a creator waits
Event = tuple[str, ...]
Link = frozenset[str]
FAULTS = ("cut", "heal", "silence", "restart", "expire")


@dataclass
class World:
    sites: list[SimSite]
    clock: Clock
    ledger: list[Execution]
    cut: set[Link] = field(default_factory=set)
    faults: int = 0

    def site(self, name: str) -> SimSite:
        return next(site for site in self.sites if site.name == name)


def initial_world() -> World:
    clock = Clock()
    ledger: list[Execution] = []
    sites = [SimSite(name, 1, clock, ledger, frozenset(SITES), LEASE) for name in SITES]
    for site in sites:
        site.successors = dict(LINES)
    steps = [new_step("step 0", target="any"), new_step("step 1", target="all")]
    job = new_job("global", steps, created_at=clock.now(), job_id=JOB)
    assert sites[0].replica.write(job)
    return World(sites, clock, ledger)


# Starting points for a deeper search of one region: the search from a prefix is
# exhaustive after it. `cut-apart`: the job reached both successors, then global
# went silent and the successors were cut from each other, each suspecting both
# others (two faults): the partition the known succession gaps need.
PREFIXES: dict[str, tuple[Event, ...]] = {
    "cut-apart": (("replicate", "global", "reg_a"), ("replicate", "global", "reg_b"),
                  ("silence", "global"), ("cut", "reg_a", "reg_b"),
                  ("suspect", "reg_a", "global"), ("suspect", "reg_b", "global"),
                  ("suspect", "reg_a", "reg_b"), ("suspect", "reg_b", "reg_a")),
}


def link(a: str, b: str) -> Link:
    return frozenset((a, b))


def events(world: World, max_faults: int) -> Iterator[Event]:
    """Every event that can happen next (some may turn out to change nothing)."""
    for site in world.sites:
        yield ("process", site.name)
        for key in sorted(site.running):
            yield ("finish", site.name, str(key[1]))
    for a, b in itertools.permutations(SITES, 2):
        cut = link(a, b) in world.cut
        if not cut and has_news(world.site(a).replica, world.site(b).replica):
            yield ("replicate", a, b)
        if cut != (b in world.site(a).silent):
            yield ("suspect" if cut else "hear", a, b)
    if world.faults < max_faults:
        yield from faults(world)


def faults(world: World) -> Iterator[Event]:
    for a, b in itertools.combinations(SITES, 2):
        yield ("heal" if link(a, b) in world.cut else "cut", a, b)
    for name in SITES:
        if any(link(name, other) not in world.cut for other in SITES if other != name):
            yield ("silence", name)
        yield ("restart", name)
    yield ("expire",)


def has_news(source: Replica, target: Replica) -> bool:
    return not set(source.docs.get(JOB, {})) <= set(target.docs.get(JOB, {}))


def apply(world: World, event: Event) -> None:
    """Carry out one event on the world (in place)."""
    kind, *names = event
    if kind in FAULTS:
        world.faults += 1
    if kind == "process":
        site = world.site(names[0])
        site.report_killed()
        site.process(JOB)
    elif kind == "finish":
        world.site(names[0]).finish((JOB, int(names[1])))
    elif kind == "replicate":
        world.site(names[1]).replica.pull(world.site(names[0]).replica, JOB)
    elif kind == "suspect":
        world.site(names[0]).silent |= {names[1]}
    elif kind == "hear":
        world.site(names[0]).silent -= {names[1]}
    elif kind == "cut":
        world.cut.add(link(*names))
    elif kind == "heal":
        world.cut.discard(link(*names))
    elif kind == "silence":
        world.cut |= {link(names[0], other) for other in SITES if other != names[0]}
    elif kind == "restart":
        world.site(names[0]).restart()
    elif kind == "expire":
        world.clock.seconds += EXPIRY_JUMP
        for site in world.sites:
            site.heartbeat()


def state_key(world: World) -> tuple[object, ...]:
    """What decides the future and the invariants, nothing else (the fault count is
    compared apart: see search)."""
    return (world.clock.seconds, frozenset(world.cut),
            tuple(sorted((e.key[1], e.epoch, e.site, e.worker) for e in world.ledger)),
            *(site_key(site) for site in world.sites))


def site_key(site: SimSite) -> tuple[object, ...]:
    return (frozenset(site.replica.docs.get(JOB, {})),
            tuple(sorted(site.booked.items())),
            tuple(sorted((k, e.epoch, e.worker) for k, e in site.running.items())),
            tuple(sorted(site.queued.items())), tuple(sorted(site.free_at.items())),
            tuple((e.key, e.epoch) for e in site.dying),
            frozenset((e.key, e.epoch) for e in site.crashed), site.silent)


def union_merge(world: World) -> Job:
    """The merge of every revision any replica holds (cached: many states share them)."""
    union = Replica()
    for site in world.sites:
        union.pull(site.replica, JOB)
    revisions = frozenset(union.docs[JOB])
    if revisions not in MERGED:
        MERGED[revisions] = core.merge(union.live_leaves(JOB))
    return MERGED[revisions]


MERGED: dict[frozenset[str], Job] = {}


def violations(world: World) -> list[str]:
    """The invariants (module docstring) this state breaks."""
    problems = []
    tokens = collections.Counter((e.key[1], e.epoch, e.site) for e in world.ledger)
    problems += [f"two runs with the token {token}" for token, n in tokens.items() if n > 1]
    final = union_merge(world)
    history = final["history"]
    runs = set(tokens)
    kept = set(counted(final))
    problems += [f"counts {run}, which never ran" for run in sorted(kept - runs)]
    in_flight = {(e.key[1], e.epoch, e.site) for site in world.sites
                 for e in [*site.running.values(), *site.dying]}
    crashed = {(e.key[1], e.epoch, e.site) for site in world.sites for e in site.crashed}
    problems += [f"run {run} is not explained by the history"
                 for run in sorted(runs - kept - in_flight - crashed)
                 if not why_superseded(history, run)]
    ended: dict[tuple[int, str], set[tuple[int, int, str]]] = collections.defaultdict(set)
    for entry in history:
        run = (entry["step"], entry["epoch"], entry["site"])
        if entry["event"] in ("finished", "failed") and run in runs and \
                (run in kept or not why_superseded(history, run)):
            broadcast = is_broadcast(final["job"][run[0]])
            ended[(run[0], run[2] if broadcast else "")].add(run)
    problems += [f"step {step} advanced twice: {sorted(ends)}"
                 for (step, _), ends in sorted(ended.items()) if len(ends) > 1]
    return problems


@dataclass
class Report:
    max_faults: int
    max_depth: int
    states: int = 0
    depth: int = 0  # the deepest level expanded
    exhausted: bool = False  # no new state below the depth bound: every interleaving seen
    seconds: float = 0.0
    counterexample: list[Event] | None = None
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        bound = "exhausted" if self.exhausted else f"depth {self.depth} of {self.max_depth}"
        found = f", VIOLATION: {'; '.join(self.problems)}" if self.problems else ", no violation"
        return (f"modelcheck: {self.states} states, faults <= {self.max_faults}, {bound}, "
                f"{self.seconds:.1f} s{found}")


def search(max_faults: int, max_depth: int, time_limit: float | None = None,
           prefix: Sequence[Event] = ()) -> Report:
    """Breadth-first over every event sequence of at most `max_depth` events and
    `max_faults` faults (those of `prefix` included) after `prefix`; stops at the
    first violation (shortest: breadth-first)."""
    report = Report(max_faults, max_depth)
    started = time.monotonic()
    root = initial_world()
    for event in prefix:
        apply(root, event)
    key = state_key(root)
    faults_at: dict[tuple[object, ...], int] = {key: 0}  # fewest faults a state was seen with
    parent: dict[tuple[object, ...], tuple[tuple[object, ...], Event] | None] = {key: None}
    frontier = [(key, pickle.dumps(root))]
    while frontier and report.depth < max_depth:
        report.depth += 1
        next_frontier = []
        for key, blob in frontier:
            for event in events(pickle.loads(blob), max_faults):
                world = pickle.loads(blob)
                try:
                    apply(world, event)
                except AssertionError as error:  # the simulator's own checks
                    problems = [f"simulator: {error}"]
                else:
                    new_key = state_key(world)
                    if faults_at.get(new_key, max_faults + 1) <= world.faults:
                        continue
                    problems = violations(world)
                if problems:
                    report.problems = problems
                    report.counterexample = [*prefix, *schedule(parent, key), event]
                    return finish(report, faults_at, started)
                faults_at[new_key] = world.faults
                parent.setdefault(new_key, (key, event))
                next_frontier.append((new_key, pickle.dumps(world)))
            if time_limit is not None and time.monotonic() - started > time_limit:
                return finish(report, faults_at, started)
        frontier = next_frontier
    report.exhausted = not frontier
    return finish(report, faults_at, started)


def finish(report: Report, seen: dict[tuple[object, ...], int], started: float) -> Report:
    report.states = len(seen)
    report.seconds = time.monotonic() - started
    return report


def schedule(parent: dict[tuple[object, ...], tuple[tuple[object, ...], Event] | None],
             key: tuple[object, ...]) -> list[Event]:
    """The events from the initial state to `key`."""
    events_back: list[Event] = []
    step = parent[key]
    while step is not None:
        key, event = step
        events_back.append(event)
        step = parent[key]
    return events_back[::-1]


def replay(schedule_events: Sequence[Event]) -> list[str]:
    """Run a schedule the search printed; the violations of the state it ends in."""
    world = initial_world()
    for event in schedule_events:
        apply(world, event)
    return violations(world)
