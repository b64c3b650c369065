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

States are keyed canonically: a replica is the set of its revision ids (each a
digest of its parent and content, as CouchDB's), a site's local state its bookings,
runs, queue and beliefs; the clock only moves by `expire`, so it is the number of
those. The visited table keeps a 64-bit hash of that key (hash compaction, as SPIN's:
two states sharing a hash, about one chance in 10^7 at 10^6 states, would hide one).

The search is depth-first with sleep sets and state caching (Godefroid, "Partial-Order
Methods for the Verification of Concurrent Systems", 1996, ch. 5): two events commute
when neither writes what the other reads or writes (`footprint`: a site's decision
touches its replica, its local state and reads the clock; a replication reads one
replica and writes another; a belief reads a link), and an event tried from a state
is not tried again after a later event it commutes with, since that order was tried
through it. Sleep sets prune transitions, not states: every state within the bound is
reached (the same count as a plain search's, checked by a test), each by fewer
paths. Persistent (ample) sets would prune states too, but every decision writes a
replica that replications read and changes what the invariants read, so their
visibility proviso leaves nearly every set full here. There is no symmetry to use
between sites with names in a succession line. A decision a site made on the same
view (replica, local state, clock) before and that changed nothing is not carried out
again. Depth-first keeps memory to the visited table; a state is expanded again when
reached with more events left. A counterexample is not the shortest: `shorten` drops
what it does not need.

Why a search of our own rather than a model checker library: the point is to run
the real decision core, and no well-kept checker explores Python code directly
(PyPI has none; TLA+/Apalache, NuSMV and the like check a model written in their
own language, which would be a second copy of the core to keep in step). Over a
deterministic simulator an explicit-state search with a visited table is a few
pages of code, and its counterexample is a schedule that `replay` runs again.
"""

from __future__ import annotations

import collections
import copy
import itertools
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


class ModelSite(SimSite):
    """A simulated site whose reading of how jobs ended is cached by the revisions its
    replica holds (the one job's): the same answer, without copying and merging the
    leaves again at every decision (a fifth of the search's time)."""

    def ended(self) -> dict[str, str]:
        revisions = frozenset(self.replica.docs.get(JOB, {}))
        if revisions not in ENDED:
            ENDED[revisions] = super().ended()
        return dict(ENDED[revisions])


ENDED: dict[frozenset[str], dict[str, str]] = {}


def clone(world: World) -> World:
    """A copy to change: revisions never change once written, so the copy shares them
    (a pickle round trip copied every revision body, a third of the search's time)."""
    clock = Clock()
    clock.seconds = world.clock.seconds
    ledger = list(world.ledger)
    sites = []
    for site in world.sites:
        twin = copy.copy(site)
        for name, value in vars(site).items():
            if isinstance(value, (dict, list, set)):
                setattr(twin, name, copy.copy(value))
        twin.clock, twin.ledger = clock, ledger
        twin.replica = Replica({doc: dict(tree) for doc, tree in site.replica.docs.items()})
        sites.append(twin)
    return World(sites, clock, ledger, set(world.cut), world.faults)


def initial_world() -> World:
    clock = Clock()
    ledger: list[Execution] = []
    sites: list[SimSite] = [ModelSite(name, 1, clock, ledger, frozenset(SITES), LEASE)
                            for name in SITES]
    for site in sites:
        site.successors = dict(LINES)
    steps = [new_step("step 0", target="any"), new_step("step 1", target="all")]
    job = new_job("global", steps, created_at=clock.now(), job_id=JOB)
    assert sites[0].replica.write(job)
    return World(sites, clock, ledger)


# Starting points for a deeper search of one region: the search from a prefix is
# exhaustive after it (every interleaving of the events that follow, to its bound).
# `cut-apart`: the job reached both successors, then global went silent and the
# successors were cut from each other, each suspecting both others (two faults): the
# partition the known succession gaps need. The other two lead to the known gaps of
# docs/reliability.md ("Not guaranteed"), as the random simulations found them:
# `part-after-revocation`: global ran step 0 and started step 1 (its part, and reg_b's
# after replication); reg_a, which saw step 0 running, suspects global, cut off, once
# the lease expired (two faults). `both-at-epoch-3`: global runs step 0; reg_a, which
# saw it, suspects global, cut off, takes the job over once the lease expired and
# runs step 0 at epoch 3; global restarts and runs step 0 at epoch 3 too (three faults).
PREFIXES: dict[str, tuple[Event, ...]] = {
    "cut-apart": (("replicate", "global", "reg_a"), ("replicate", "global", "reg_b"),
                  ("silence", "global"), ("cut", "reg_a", "reg_b"),
                  ("suspect", "reg_a", "global"), ("suspect", "reg_b", "global"),
                  ("suspect", "reg_a", "reg_b"), ("suspect", "reg_b", "reg_a")),
    "part-after-revocation": (("process", "global"), ("replicate", "global", "reg_a"),
                              ("finish", "global", "0"), ("replicate", "global", "reg_b"),
                              ("process", "reg_b"), ("silence", "global"),
                              ("suspect", "reg_a", "global"), ("expire",)),
    "both-at-epoch-3": (("process", "global"), ("replicate", "global", "reg_a"),
                        ("silence", "global"), ("suspect", "reg_a", "global"), ("expire",),
                        ("process", "reg_a"), ("restart", "global"), ("process", "global")),
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


def decision_key(world: World, event: Event) -> tuple[object, ...] | None:
    """For a site's decision, all it depends on: its own state and the clock."""
    if event[0] != "process":
        return None
    return (event[1], world.clock.seconds, site_key(world.site(event[1])))


UNCHANGED: set[tuple[object, ...] | None] = set()  # decisions known to change nothing


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


def footprint(event: Event) -> tuple[frozenset[object], frozenset[object]]:
    """What an event reads (its enabling condition included) and what it writes.

    A site's decision reads the clock and its beliefs of silence, and writes its
    replica and its local state (bookings, runs, queue); the ledger of runs only
    grows and is compared as a set, so two sites appending to it commute."""
    kind, *names = event
    if kind in ("process", "finish"):
        site = names[0]
        return (frozenset({"clock", ("belief", site)}),
                frozenset({("replica", site), ("local", site)}))
    if kind == "replicate":
        return (frozenset({("replica", names[0]), ("link", link(*names))}),
                frozenset({("replica", names[1])}))
    if kind in ("suspect", "hear"):
        return frozenset({("link", link(*names))}), frozenset({("belief", names[0])})
    if kind in ("cut", "heal"):
        return frozenset(), frozenset({"faults", ("link", link(*names))})
    if kind == "silence":
        return frozenset(), frozenset({"faults", *(("link", link(names[0], other))
                                                    for other in SITES if other != names[0])})
    if kind == "restart":
        return frozenset(), frozenset({"faults", ("local", names[0])})
    return frozenset(), frozenset({"faults", "clock", *(("replica", site) for site in SITES),
                                   *(("local", site) for site in SITES)})


def independent(first: Event, second: Event) -> bool:
    """Neither writes what the other reads or writes: from any state where both are
    enabled, each stays enabled after the other and both orders end in one state."""
    reads_1, writes_1 = FOOTPRINTS.get(first) or FOOTPRINTS.setdefault(first, footprint(first))
    reads_2, writes_2 = FOOTPRINTS.get(second) or \
        FOOTPRINTS.setdefault(second, footprint(second))
    return not (writes_1 & (reads_2 | writes_2) or writes_2 & reads_1)


FOOTPRINTS: dict[Event, tuple[frozenset[object], frozenset[object]]] = {}


@dataclass
class Report:
    max_faults: int
    max_depth: int
    states: int = 0
    transitions: int = 0  # events carried out (those a sleep set skips are not)
    depth: int = 0  # the most events a path searched has
    exhausted: bool = True  # no path reached the depth bound: every interleaving seen
    stopped: bool = False  # out of time: some paths within the bound were not searched
    seconds: float = 0.0
    counterexample: list[Event] | None = None
    problems: list[str] = field(default_factory=list)
    passed: int = 0  # states with violations other than those sought, searched past

    def summary(self) -> str:
        if self.exhausted and not self.stopped:
            bound = "exhausted"
        else:
            bound = f"depth {self.max_depth}, " + \
                ("OUT OF TIME: not all searched" if self.stopped else "all")
        found = f", VIOLATION: {'; '.join(self.problems)}" if self.problems else \
            ", no violation"
        if self.passed and not self.problems:
            found += f" sought ({self.passed} states with others)"
        return (f"modelcheck: {self.states} states, {self.transitions} transitions, "
                f"faults <= {self.max_faults}, {bound}, {self.seconds:.1f} s{found}")


Node = tuple[int, int]  # a hash of a state's key, and the faults spent reaching it


@dataclass
class Search:
    """Depth-first, with sleep sets and state caching (Godefroid 1996, ch. 5): a state
    remembers the depth it was expanded at and its sleep set (as bits), and is expanded
    again only when reached with more events left, or with a sleep set that lets
    through events the stored one kept asleep (then for those events only)."""
    report: Report
    prefix: Sequence[Event]
    sleep_sets: bool
    deadline: float | None
    seek: str
    seen: dict[Node, tuple[int, int]] = field(default_factory=dict)  # depth, sleep bits
    bits: dict[Event, int] = field(default_factory=dict)
    path: list[Event] = field(default_factory=list)

    def bit(self, event: Event) -> int:
        return self.bits.setdefault(event, 1 << len(self.bits))

    def expand(self, world: World, node: Node, depth: int, sleep: int, only: int | None) -> bool:
        """Every continuation of `world` (reached after `depth` events) not covered
        already; False when the search stops (a violation, or out of time)."""
        self.report.depth = max(self.report.depth, depth)
        if depth == self.report.max_depth:
            self.report.exhausted = False
            return True
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.report.stopped = True
            return False
        asleep = [event for event, bit in self.bits.items() if sleep & bit]
        for event in events(world, self.report.max_faults):
            bit = self.bit(event)
            if sleep & bit if only is None else not only & bit:
                continue
            unchanged = decision_key(world, event)
            if unchanged in UNCHANGED:
                sleep, asleep = self.fall_asleep(sleep, asleep, event)
                continue  # this site decided on this view before, and did nothing
            after = clone(world)
            self.report.transitions += 1
            self.path.append(event)
            try:
                apply(after, event)
            except AssertionError as error:  # the simulator's own checks
                return self.found([f"simulator: {error}"])
            child = (hash(state_key(after)), after.faults)
            child_sleep = sum(self.bits[t] for t in asleep if independent(t, event))
            sleep, asleep = self.fall_asleep(sleep, asleep, event)
            if child == node:
                if unchanged is not None:
                    UNCHANGED.add(unchanged)
            elif not self.reach(after, child, depth + 1, child_sleep):
                return False
            self.path.pop()
        return True

    def fall_asleep(self, sleep: int, asleep: list[Event],
                    event: Event) -> tuple[int, list[Event]]:
        """An event tried from a state sleeps after the later events it commutes with:
        the other order was tried through it (without sleep sets: nothing sleeps)."""
        if not self.sleep_sets:
            return sleep, asleep
        return sleep | self.bits[event], [*asleep, event]

    def reach(self, world: World, node: Node, depth: int, sleep: int) -> bool:
        """A state reached: check it if new, and expand it as far as the visits before
        leave to do."""
        key, spent = node
        for fewer in range(spent):
            seen = self.seen.get((key, fewer))
            if seen is not None and seen[0] <= depth and not seen[1] & ~sleep:
                return True  # seen with more faults and events left, and no fewer to try
        seen = self.seen.get(node)
        only = None
        if seen is None:
            problems = violations(world)
            if any(self.seek in problem for problem in problems):
                return self.found(problems)
            self.report.passed += bool(problems)
        elif seen[0] <= depth:
            if not seen[1] & ~sleep:
                return True
            only, sleep = seen[1] & ~sleep, seen[1] & sleep
        self.seen[node] = (depth, sleep)
        return self.expand(world, node, depth, sleep, only)

    def found(self, problems: list[str]) -> bool:
        self.report.problems = problems
        self.report.counterexample = [*self.prefix, *self.path]
        return False


def search(max_faults: int, max_depth: int, time_limit: float | None = None,
           prefix: Sequence[Event] = (), sleep_sets: bool = True, seek: str = "") -> Report:
    """Every event sequence of at most `max_depth` events and `max_faults` faults
    (those of `prefix` included) after `prefix`, depth-first; stops at the first
    violation (with `seek`, the first whose text has it: the search goes on past a
    known gap to look for another). With `sleep_sets` an event that commutes with one
    already tried from the same state is not tried again after it: every state is
    still reached (sleep sets prune transitions, not states), each by fewer paths."""
    started = time.monotonic()
    for cache in (UNCHANGED, MERGED, ENDED):
        cache.clear()  # each search asks the core afresh (a test may have patched it)
    root = initial_world()
    for event in prefix:
        apply(root, event)
    deadline = None if time_limit is None else started + time_limit
    state = Search(Report(max_faults, max_depth), prefix, sleep_sets, deadline, seek)
    state.reach(root, (hash(state_key(root)), root.faults), 0, 0)
    state.report.states = len({key for key, _ in state.seen})
    state.report.seconds = time.monotonic() - started
    return state.report


def replay(schedule_events: Sequence[Event]) -> list[str]:
    """Run a schedule the search printed; the violations of the state it ends in."""
    world = initial_world()
    for event in schedule_events:
        apply(world, event)
    return violations(world)


def possible(schedule_events: Sequence[Event], max_faults: int) -> bool:
    """Is every event of the schedule one the search could take where it comes?"""
    world = initial_world()
    for event in schedule_events:
        if event not in events(world, max_faults):
            return False
        apply(world, event)
    return True


def shorten(schedule_events: Sequence[Event]) -> list[Event]:
    """A shorter schedule that the search could take and that still ends in a
    violation: each event is dropped in turn while the rest still does (a depth-first
    search finds a counterexample, not the shortest)."""
    budget = sum(event[0] in FAULTS for event in schedule_events)
    shortest = list(schedule_events)
    index = 0
    while index < len(shortest):
        shorter = shortest[:index] + shortest[index + 1:]
        if possible(shorter, budget) and replay(shorter):
            shortest = shorter
        else:
            index += 1
    return shortest
