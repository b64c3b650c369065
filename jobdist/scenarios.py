"""The thesis's evaluation scenarios (section 6), runnable on a local cluster.

Each scenario brings up its own local cluster (in-memory servers on free
ports), submits its jobs at the creator site at once, waits until every job
has ended, and measures makespan and revisions per job. Every step appends
`start`/`end` lines to a ledger file, so a run can be checked: every step ran
exactly once, on a site its target allows, the steps of a job in order.
"""

from __future__ import annotations

import collections
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .cluster import LocalCluster
from .couch import Couch, Database
from .localserver import free_port
from .model import ANY, Doc, new_job, new_step

SITE_NAMES = ("global", "reg_a", "reg_b")


@dataclass(frozen=True)
class Scenario:
    name: str
    sites: int
    jobs: int
    targets: tuple[str, ...]  # the target of each step of every job
    thesis: str  # the thesis's own figures, for the table

    def job_steps(self, step_seconds: float, ledger: Path) -> list[Doc]:
        return [new_step(ledger_command(step_seconds, ledger), target=t) for t in self.targets]


THESIS_SCENARIOS = (
    Scenario("1: 3 sites, 1 job", 3, 1, (ANY, ANY, ANY), "15 s (15 s), revs 12/12"),
    Scenario("2: 1 site, 6 jobs", 1, 6, (ANY, ANY, ANY), "51 s (45 s), revs 12/20"),
    Scenario("2: 2 sites, 6 jobs", 2, 6, (ANY, ANY, ANY), "31 s (22.5 s), revs 12/16"),
    Scenario("2: 3 sites, 6 jobs", 3, 6, (ANY, ANY, ANY), "17 s (15 s), revs 12/13"),
    Scenario("3: 2 sites, 3 jobs A,B,A", 2, 3, ("global", "reg_a", "global"),
             "23 s (20 s), revs 6/8"),
    Scenario("4: 3 sites, 90 jobs", 3, 90, (ANY, ANY, ANY), "225 s (270 s)"),
)


def ledger_command(step_seconds: float, ledger: Path) -> str:
    line = '"$JOBDIST_JOB_ID $JOBDIST_STEP $JOBDIST_SITE $JOBDIST_EPOCH"'
    return (f"echo start {line} >> {ledger} && sleep {step_seconds} && "
            f"echo end {line} >> {ledger}")


@dataclass
class Result:
    scenario: Scenario
    step_seconds: float
    makespan: float
    ideal: float  # the best any scheduler could do (unit-step list schedule)
    thesis_optimum: float  # the thesis's formula: steps * jobs * step / workers
    revisions: list[int]
    statuses: collections.Counter[str]
    ledger: list[tuple[str, str, int, str, int]] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.makespan / self.ideal


TOPOLOGIES = ("mesh", "star", "filtered")


def write_sites(directory: Path, count: int, workers: int = 2,
                keepalive: float = 5.0, stale_after: float = 30.0,
                topology: str = "mesh", lease: float = 60.0) -> Path:
    """A sites directory of `count` sites on free ports.

    mesh: every pair replicates; star: `global` is the hub, the others
    replicate with it only, and it passes on to each only what concerns it;
    filtered: a mesh where each site pushes to a peer only what concerns it.
    """
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}; choose from {', '.join(TOPOLOGIES)}")
    directory.mkdir(parents=True, exist_ok=True)
    names = SITE_NAMES[:count] if count <= len(SITE_NAMES) else (
        *SITE_NAMES, *(f"reg_{n}" for n in range(len(SITE_NAMES), count)))
    for name in names:
        hub = name == names[0]
        if topology == "star":
            peers = [p for p in names if p != name] if hub else [names[0]]
        else:
            peers = [p for p in names if p != name]
        filtered = topology in ("star", "filtered")
        (directory / f"{name}.toml").write_text(
            f'name = "{name}"\nworkers = {workers}\n'
            f"peers = [{', '.join(f'{chr(34)}{p}{chr(34)}' for p in peers)}]\n\n"
            f'[couch]\nurl = "http://127.0.0.1:{free_port()}"\ndatabase = "jobs"\n\n'
            f"[replication]\nfiltered = {str(filtered).lower()}\n"
            f"relay = {str(topology == 'star' and hub).lower()}\n\n"
            f"[keepalive]\nperiod = {keepalive}\nstale_after = {stale_after}\n\n"
            f"[daemon]\nshutdown_grace = 2.0\nlease = {lease}\nheartbeat = {lease / 4}\n"
            f"clock_skew_margin = {lease / 6}\n")
    return directory


def site_db(cluster: LocalCluster, name: str) -> Database:
    site = cluster.sites[name]
    return Couch(site.couch_url, user=site.user, password=site.password).database(site.database)


def submit_all(db: Database, creator: str, steps: list[Doc], count: int,
               priority: int = 0) -> list[str]:
    jobs = [new_job(creator, steps, priority=priority) for _ in range(count)]
    db.bulk_docs(jobs)
    return [job["_id"] for job in jobs]


def wait_until_done(db: Database, ids: list[str], timeout: float,
                    on_progress: Callable[[int], None] | None = None) -> list[Doc]:
    deadline = time.monotonic() + timeout
    while True:
        docs = db.bulk_get(ids)
        done = [d for d in docs if d.get("job_status")]
        if on_progress:
            on_progress(len(done))
        if len(done) == len(ids):
            return docs
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(ids) - len(done)} of {len(ids)} jobs did not end in time")
        time.sleep(0.1)


def read_ledger(path: Path) -> list[tuple[str, str, int, str, int]]:
    """(kind, job id, step, site, epoch) per line."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        kind, job_id, step, site, epoch = line.split()
        rows.append((kind, job_id, int(step), site, int(epoch)))
    return rows


def ideal_makespan(scenario: Scenario, workers: int) -> int:
    """Unit steps scheduled greedily slot by slot: exact for these small cases."""
    sites = SITE_NAMES[:scenario.sites]
    progress = [0] * scenario.jobs
    slots = 0
    while min(progress) < len(scenario.targets):
        capacity = dict.fromkeys(sites, workers)
        for job, step in enumerate(progress):
            if step == len(scenario.targets):
                continue
            target = scenario.targets[step]
            candidates = sites if target == ANY else [target]
            site = next((s for s in candidates if capacity[s] > 0), None)
            if site is not None:
                capacity[site] -= 1
                progress[job] += 1
        slots += 1
    return slots


def run_scenario(scenario: Scenario, step_seconds: float = 0.5, workers: int = 2,
                 keepalive: float = 5.0, timeout: float = 300.0,
                 on_progress: Callable[[int], None] | None = None,
                 work_dir: Path | None = None, topology: str = "mesh") -> Result:
    with tempfile.TemporaryDirectory(prefix="jobdist-scenario-", dir=work_dir) as tmp:
        root = Path(tmp)
        ledger = root / "ledger.txt"
        sites = write_sites(root / "sites", scenario.sites, workers, keepalive,
                            topology=topology)
        cluster = LocalCluster(sites, root / "state", in_memory=True)
        cluster.up()
        try:
            db = site_db(cluster, "global")
            started = time.monotonic()
            ids = submit_all(db, "global", scenario.job_steps(step_seconds, ledger),
                             scenario.jobs)
            docs = wait_until_done(db, ids, timeout, on_progress)
            makespan = time.monotonic() - started
        finally:
            cluster.down()
        total_workers = workers * scenario.sites
        return Result(
            scenario=scenario,
            step_seconds=step_seconds,
            makespan=makespan,
            ideal=ideal_makespan(scenario, workers) * step_seconds,
            thesis_optimum=len(scenario.targets) * scenario.jobs * step_seconds / total_workers,
            revisions=[int(doc["_rev"].split("-")[0]) for doc in docs],
            statuses=collections.Counter(doc["job_status"] for doc in docs),
            ledger=read_ledger(ledger),
        )


def check_ledger(result: Result) -> list[str]:
    """What is wrong with a run: steps run twice, out of order, or on a wrong site."""
    problems = []
    starts = [row for row in result.ledger if row[0] == "start"]
    ends = {(row[1], row[2]) for row in result.ledger if row[0] == "end"}
    runs = collections.Counter((row[1], row[2]) for row in starts)
    for (job_id, step), count in runs.items():
        if count != 1:
            problems.append(f"{job_id} step {step} started {count} times")
        if (job_id, step) not in ends:
            problems.append(f"{job_id} step {step} never ended")
    by_job: dict[str, list[int]] = collections.defaultdict(list)
    for _, job_id, step, site, _ in starts:
        by_job[job_id].append(step)
        target = result.scenario.targets[step]
        if target not in (ANY, site):
            problems.append(f"{job_id} step {step} ran on {site}, target {target}")
    for job_id, steps in by_job.items():
        if steps != sorted(steps):
            problems.append(f"{job_id} steps out of order: {steps}")
    expected = result.scenario.jobs * len(result.scenario.targets)
    if len(runs) != expected:
        problems.append(f"{len(runs)} steps ran, expected {expected}")
    return problems
