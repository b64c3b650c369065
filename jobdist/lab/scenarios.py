"""The thesis's evaluation scenarios (section 6), runnable on a local cluster.

Each scenario brings up its own local cluster (in-memory servers on free
ports), submits its jobs at the creator site at once, waits until every job
has ended, and measures makespan and revisions per job. Every step appends
`start`/`end` lines to a ledger file, so a run can be checked (audit.py).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import load_sites
from ..couch import CouchError, Database
from ..couch_changes import changes
from ..model import ANY, Doc, new_job, new_step
from ..setup import couch_of
from .audit import LedgerRow, audit_run, read_ledger
from .cluster import LocalCluster
from .deployment import DeploymentSites, load_deployment
from .localserver import free_port
from .proxy import FaultProxy, LinkShape, ProxyHub

SITE_NAMES = ("global", "reg_a", "reg_b")


THESIS_STEP_SECONDS = 5.0  # the step length of the thesis's runs


@dataclass(frozen=True)
class ThesisFigures:
    """What the thesis reports for a scenario, at its 5 s steps."""

    makespan: float  # seconds, as measured
    optimum: float  # seconds: its own formula, steps * jobs * 5 s / workers
    revisions: tuple[int, int] | None = None  # revisions per job, min and max

    def __str__(self) -> str:
        text = f"{self.makespan:g} s (optimum {self.optimum:g} s)"
        return text + (f", revs {self.revisions[0]}/{self.revisions[1]}"
                       if self.revisions else "")


@dataclass(frozen=True)
class Scenario:
    name: str
    sites: int
    jobs: int
    targets: tuple[str, ...]  # the target of each step of every job
    thesis: ThesisFigures

    def job_steps(self, step_seconds: float, ledger: Path) -> list[Doc]:
        return [new_step(ledger_command(step_seconds, ledger), target=t) for t in self.targets]


THESIS_SCENARIOS = (
    Scenario("1: 3 sites, 1 job", 3, 1, (ANY, ANY, ANY), ThesisFigures(15, 15, (12, 12))),
    Scenario("2: 1 site, 6 jobs", 1, 6, (ANY, ANY, ANY), ThesisFigures(51, 45, (12, 20))),
    Scenario("2: 2 sites, 6 jobs", 2, 6, (ANY, ANY, ANY), ThesisFigures(31, 22.5, (12, 16))),
    Scenario("2: 3 sites, 6 jobs", 3, 6, (ANY, ANY, ANY), ThesisFigures(17, 15, (12, 13))),
    Scenario("3: 2 sites, 3 jobs A,B,A", 2, 3, ("global", "reg_a", "global"),
             ThesisFigures(23, 20, (6, 8))),
    Scenario("4: 3 sites, 90 jobs", 3, 90, (ANY, ANY, ANY), ThesisFigures(225, 270)),
)


def ledger_command(step_seconds: float, ledger: Path) -> str:
    """A step that appends `start` and `end` lines to the ledger, each with its job, step,
    site, epoch and the Unix time it was written (the fault audit matches runs to faults)."""
    line = '"$JOBDIST_JOB_ID $JOBDIST_STEP $JOBDIST_SITE $JOBDIST_EPOCH $(date +%s.%N)"'
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
    ledger: list[LedgerRow] = field(default_factory=list)
    docs: list[Doc] = field(default_factory=list)  # each job as it ended

    @property
    def ratio(self) -> float:
        return self.makespan / self.ideal

    @property
    def ideal_at_thesis_steps(self) -> float:
        """The ideal makespan had the steps lasted the thesis's 5 s."""
        return self.ideal / self.step_seconds * THESIS_STEP_SECONDS

    @property
    def ratio_at_thesis_steps(self) -> float:
        """An estimate of `ratio` at 5 s steps: what the sites add to the ideal (replication
        hops, decisions) is a time per job, not a share of the step, so it is added as
        measured. At short steps that time dominates the ratio."""
        return (self.ideal_at_thesis_steps + self.makespan - self.ideal) / \
            self.ideal_at_thesis_steps

    @property
    def thesis_ratio(self) -> float:
        """The thesis's makespan over the same ideal, at the same 5 s steps: its own
        optimum formula ignores that a job's steps run one after another."""
        return self.scenario.thesis.makespan / self.ideal_at_thesis_steps


TOPOLOGIES = ("mesh", "star", "filtered")


Link = tuple[str, str]  # (pushing site, receiving site): one replication


# The design's sites are regions apart: one-way latency between each pair (a
# nearby region, and two far ones) and a bandwidth any region pair has.
WAN = 1_000_000.0  # bytes a second


REGIONS: dict[frozenset[str], LinkShape] = {
    frozenset({"global", "reg_a"}): LinkShape(0.040, 0.010, WAN),
    frozenset({"global", "reg_b"}): LinkShape(0.120, 0.030, WAN),
    frozenset({"reg_a", "reg_b"}): LinkShape(0.120, 0.030, WAN),
}


def regions_apart(link: Link) -> LinkShape:
    """The link between two of the design's regions (40 or 120 ms one way)."""
    return REGIONS.get(frozenset(link), LinkShape(0.120, 0.030, WAN))


PORT_ATTEMPTS = 3


@contextmanager
def proxied_sites(directory: Path, count: int, shape: Callable[[Link], LinkShape],
                  **options: Any) -> Iterator[tuple[Path, dict[Link, FaultProxy]]]:
    """A sites directory whose every replication runs through a proxy shaped by
    `shape` (and that a test can cut); the proxies stop when the block ends."""
    names = site_names(count)
    hub = ProxyHub()
    try:
        for attempt in range(PORT_ATTEMPTS):
            ports = {(a, b): free_port() for a in names for b in names if a != b}
            peer_urls = {a: {b: f"http://127.0.0.1:{port}" for (src, b), port in ports.items()
                             if src == a} for a in names}
            sites_dir = write_sites(directory, count, peer_urls=peer_urls, **options)
            couch_ports = {site.name: site.couch.port for site in load_sites(sites_dir).values()}
            try:
                proxies = {link: hub.proxy(port, couch_ports[link[1]], shape(link))
                           for link, port in ports.items()}
                break
            except OSError as error:
                # Another process on a shared machine took a port between free_port and
                # the bind: choose them all again.
                if error.errno != errno.EADDRINUSE or attempt == PORT_ATTEMPTS - 1:
                    raise
                hub.close()
                hub = ProxyHub()
        yield sites_dir, proxies
    finally:
        hub.close()


def _couch_url(name: str, hosts: Mapping[str, str] | None) -> str:
    return f"http://{hosts[name]}:5984" if hosts else f"http://127.0.0.1:{free_port()}"


def site_names(count: int) -> tuple[str, ...]:
    return SITE_NAMES[:count] if count <= len(SITE_NAMES) else (
        *SITE_NAMES, *(f"reg_{n}" for n in range(len(SITE_NAMES), count)))


def write_sites(directory: Path, count: int, workers: int = 2,
                keepalive: float = 5.0, stale_after: float = 30.0,
                topology: str = "mesh", lease: float = 60.0, booking_timeout: float = 60.0,
                peer_urls: Mapping[str, Mapping[str, str]] | None = None,
                successors: Mapping[str, list[str]] | None = None,
                creator_timeout: float | None = None,
                hosts: Mapping[str, str] | None = None) -> Path:
    """A sites directory of `count` sites on free ports, with authentication on
    (the local cluster writes the credentials files under `secrets/`).

    mesh: every pair replicates; star: `global` is the hub, the others
    replicate with it only, and it passes on to each only what concerns it;
    filtered: a mesh where each site pushes to a peer only what concerns it.
    `peer_urls[site][peer]`: where `site` sends its replication to `peer` (a proxy).
    `successors` and `creator_timeout`: every site's `[succession]` (none: off).
    `hosts[site]`: the site's own address (a network namespace, jobdist.lab.netns),
    where its server listens on CouchDB's port; otherwise 127.0.0.1 and a free port.
    """
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}; choose from {', '.join(TOPOLOGIES)}")
    directory.mkdir(parents=True, exist_ok=True)
    names = site_names(count)
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
            f'[couch]\nurl = "{_couch_url(name, hosts)}"\ndatabase = "jobs"\n'
            f'credentials = "secrets/{name}.toml"\nadmin_credentials = "secrets/admin.toml"\n\n'
            f"[replication]\nfiltered = {str(filtered).lower()}\n"
            f"relay = {str(topology == 'star' and hub).lower()}\n"
            f"peer_urls = {_toml_table((peer_urls or {}).get(name, {}))}\n\n"
            f"[daemon]\nshutdown_grace = 2.0\nlease = {lease}\n"
            f"clock_skew_margin = {lease / 6}\n\n"
            f"[tuning]\nbooking_timeout = {booking_timeout}\nkeepalive_period = {keepalive}\n"
            f"keepalive_stale_after = {stale_after}\n"
            + _succession(successors, creator_timeout))
    return directory


def _succession(successors: Mapping[str, list[str]] | None,
                creator_timeout: float | None) -> str:
    if successors is None:
        return ""
    lines = ", ".join(f"{creator} = [{', '.join(chr(34) + s + chr(34) for s in line)}]"
                      for creator, line in successors.items())
    timeout = "" if creator_timeout is None else f"creator_timeout = {creator_timeout}\n"
    return f"\n[succession]\nsuccessors = {{ {lines} }}\n{timeout}"


def _toml_table(values: Mapping[str, str]) -> str:
    return "{ " + ", ".join(f'{key} = "{value}"' for key, value in values.items()) + " }"


def site_db(cluster: LocalCluster, name: str) -> Database:
    site = cluster.sites[name]
    return couch_of(site).database(site.couch.database)


def submit_all(db: Database, creator: str, steps: list[Doc], count: int,
               priority: int = 0) -> list[str]:
    jobs = [new_job(creator, steps, priority=priority) for _ in range(count)]
    db.bulk_docs(jobs)
    return [job["_id"] for job in jobs]


def wait_until_done(db: Database, ids: list[str], timeout: float,
                    on_progress: Callable[[int], None] | None = None) -> list[Doc]:
    """The jobs once every one has ended, as `db` has them; TimeoutError if they do not.

    It follows the database's changes rather than polling, so a makespan is measured
    to the moment the last end reached `db`, and the wait costs the server no reads
    while nothing changes.
    """
    deadline = time.monotonic() + timeout
    while True:
        since = db.last_seq()
        docs = db.bulk_get(ids)
        pending = set(ids) - {d["_id"] for d in docs if d.get("job_status")}
        if not pending:
            if on_progress:
                on_progress(len(ids))
            return docs
        _follow_until_ended(db, since, pending, deadline, len(ids), on_progress)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} of {len(ids)} jobs did not end in time")


def _follow_until_ended(db: Database, since: object, pending: set[str], deadline: float,
                        total: int, on_progress: Callable[[int], None] | None) -> None:
    """Take each job from `pending` as the feed shows it ended; return when none is left,
    at the deadline, or when the server fails (the caller reads again)."""
    if on_progress:
        on_progress(total - len(pending))
    try:
        for change in changes(db, since, include_docs=True, heartbeat_ms=1000,
                              timeout=max(0.0, deadline - time.monotonic())):
            if change.id in pending and (change.doc or {}).get("job_status"):
                pending.discard(change.id)
                if on_progress:
                    on_progress(total - len(pending))
                if not pending:
                    return
    except CouchError:
        time.sleep(0.2)  # a server killed or cut off by a fault: read again, then follow


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
                 work_dir: Path | None = None, topology: str = "mesh",
                 links: Callable[[Link], LinkShape] | None = None,
                 in_memory: bool = True, deployment: Path | None = None) -> Result:
    """Run a scenario on fresh local sites; with `links`, every replication goes
    through a proxy that shapes it so (latency, jitter, bandwidth). The demo's servers
    keep nothing on disk; the benchmarks' do unless asked (`jobdist bench --in-memory`).

    With `deployment` (a sites directory), on its servers (lab.deployment) instead: its
    first `scenario.sites` sites stand for global, reg_a, ... and have the workers; its
    others run with none."""
    with tempfile.TemporaryDirectory(prefix="jobdist-scenario-", dir=work_dir) as tmp, \
            contextlib.ExitStack() as stack:
        root = Path(tmp)
        ledger = root / "ledger.txt"
        cluster = stack.enter_context(scenario_sites(
            root, scenario.sites, workers, keepalive, topology, links, in_memory, deployment))
        names = dict(zip(SITE_NAMES, cluster.sites, strict=False))  # the scenario's: ours
        steps = [step | {"target": names.get(step["target"], step["target"])}
                 for step in scenario.job_steps(step_seconds, ledger)]
        db = site_db(cluster, names["global"])
        started = time.monotonic()
        ids = submit_all(db, names["global"], steps, scenario.jobs)
        docs = wait_until_done(db, ids, timeout, on_progress)
        makespan = time.monotonic() - started
        stack.close()  # the sites stop; the ledger stays until the directory goes
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
            docs=docs,
        )


def scenario_sites(root: Path, count: int, workers: int, keepalive: float, topology: str,
                   links: Callable[[Link], LinkShape] | None, in_memory: bool,
                   deployment: Path | None) -> contextlib.AbstractContextManager[LocalCluster]:
    """The sites a scenario runs on, started when the block is entered (run_scenario)."""
    if deployment is not None:
        names = list(load_deployment(deployment))
        return DeploymentSites(deployment, root, {name: workers if index < count else 0
                                                  for index, name in enumerate(names)},
                               keepalive)
    options: dict[str, Any] = {"workers": workers, "keepalive": keepalive,
                               "topology": topology}
    if links is None:
        return LocalCluster(write_sites(root / "sites", count, **options), root / "state",
                            in_memory=in_memory)
    return _proxied_cluster(root, count, links, in_memory, options)


@contextmanager
def _proxied_cluster(root: Path, count: int, links: Callable[[Link], LinkShape],
                     in_memory: bool, options: dict[str, Any]) -> Iterator[LocalCluster]:
    with proxied_sites(root / "sites", count, links, **options) as (sites, _), \
            LocalCluster(sites, root / "state", in_memory=in_memory) as cluster:
        yield cluster


def check_ledger(result: Result) -> list[str]:
    """What is wrong with a fault-free run: any step run twice is wrong here."""
    docs = {doc["_id"]: doc for doc in result.docs}
    audit = audit_run(result.ledger, docs, list(docs), expect=None)
    problems = audit.problems + [f"ran again with no fault: {run}" for run in audit.duplicates]
    if len(docs) != result.scenario.jobs:
        problems.append(f"{len(docs)} jobs ended, expected {result.scenario.jobs}")
    return problems
