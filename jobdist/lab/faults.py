"""Fault injection on local sites: a trial (a cluster on short leases, seeded jobs whose
steps write a ledger, the fault log, the end-of-run audit), the fault storm (random,
overlapping faults of every kind while bursts of jobs arrive), the summary table,
and the soak that runs storms for a chosen time. The fault suite (tests/faults) and
`jobdist bench soak` share all of it.

Every fault is logged once per injection with its sites and the times it began and
was healed; `Trial.finish` audits the run (audit.audit_run) and then names,
for every duplicate run, the fault that made it unavoidable (faultlog.audit_faults):
a duplicate no fault explains is a problem, as is one its history does not.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..client import read_merged_many
from ..couch import CouchError, Database, Saved
from ..errors import JobdistError
from ..model import Doc, new_job, new_step
from .audit import Audit, audit_run, ledger_times, read_ledger
from .cluster import LocalCluster
from .faultlog import Fault, audit_faults
from .proxy import FaultProxy, LinkShape
from .scenarios import (
    Link,
    ledger_command,
    proxied_sites,
    regions_apart,
    site_db,
    wait_until_done,
    write_sites,
)

log = logging.getLogger("jobdist.faults")

LEASE = 6.0  # heartbeat 1.5 s from it (Timings), and clock-skew margin 1 s (write_sites)
MARGIN = LEASE / 6
SEED_VARIABLE = "JOBDIST_FAULT_SEED"
TARGETS: tuple[str | list[str], ...] = (
    "any", "any", "global", "reg_a", "reg_b", ["reg_a", "reg_b"], ["global", "reg_b"])


def fault_seed(default: int | None = None) -> int:
    """$JOBDIST_FAULT_SEED to replay a run, else `default`, else a fresh random seed."""
    given = os.environ.get(SEED_VARIABLE)
    if given:
        return int(given)
    return default if default is not None else random.SystemRandom().randrange(1, 10**6)


@dataclass
class Trial:
    """One scenario's run: its cluster, randomness, jobs, ledger and fault log."""

    name: str
    seed: int
    root: Path
    cluster: LocalCluster
    links: dict[Link, FaultProxy] = field(default_factory=dict)
    lease: float = LEASE
    ids: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    audit: Audit | None = None
    docs: dict[str, Doc] = field(default_factory=dict)  # the jobs as they ended, merged
    rounds: int = 0
    dead: set[str] = field(default_factory=set)  # sites killed for good: not waited for
    fault_log: list[Fault] = field(default_factory=list)

    @property
    def alive(self) -> list[str]:
        return [site for site in sorted(self.cluster.sites) if site not in self.dead]

    @property
    def faults(self) -> Counter[str]:
        return Counter(fault.kind for fault in self.fault_log)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.ledger = self.root / "ledger.txt"
        self.started = time.monotonic()
        self.origin = time.time()  # fault and ledger times are Unix times
        self._log_lock = threading.Lock()

    def db(self, site: str = "global") -> Database:
        return site_db(self.cluster, site)

    def fault(self, kind: str, sites: str | tuple[str, ...], detail: str = "") -> Fault:
        """Log a fault injected now (kind: a key of faultlog.EFFECTS); `healed` ends it."""
        with self._log_lock:
            fault = Fault(len(self.fault_log) + 1, kind,
                          (sites,) if isinstance(sites, str) else sites, time.time(),
                          detail=detail)
            self.fault_log.append(fault)
        log.warning("%s", fault.describe(self.origin))
        return fault

    def healed(self, fault: Fault) -> None:
        fault.end = time.time()

    @contextmanager
    def injecting(self, kind: str, sites: str | tuple[str, ...],
                  detail: str = "") -> Iterator[Fault]:
        """A fault from the start of the block (once injected) to its end (healed)."""
        fault = self.fault(kind, sites, detail)
        try:
            yield fault
        finally:
            self.healed(fault)

    def steps(self, count: int, seconds: tuple[float, float] = (0.2, 0.5),
              targets: tuple[str | list[str], ...] = TARGETS) -> list[Doc]:
        return [new_step(ledger_command(round(self.rng.uniform(*seconds), 2), self.ledger),
                         target=self.rng.choice(targets)) for _ in range(count)]

    def submit(self, jobs: list[list[Doc]], creator: str = "global") -> list[str]:
        """Create the jobs at `creator` in one `_bulk_docs` request."""
        docs = [new_job(creator, steps) for steps in jobs]
        results = self.db(creator).bulk_docs(docs)
        assert all(isinstance(r, Saved) for r in results), results
        self.ids += [doc["_id"] for doc in docs]
        return [doc["_id"] for doc in docs]

    def live(self) -> int:
        """How many jobs have not ended yet, as the creator (else the first site alive)
        sees them."""
        return sum(1 for doc in self.db(self.alive[0]).bulk_get(self.ids)
                   if not doc.get("job_status"))

    def runs(self) -> int:
        return sum(row[0] == "start" for row in read_ledger(self.ledger))

    def finish(self, timeout: float, expect: str | None = "success") -> Audit:
        """Wait until every site alive sees every job ended, then audit the run: its
        history explains every duplicate, and so does a fault of the log."""
        deadline = time.monotonic() + timeout
        for site in self.alive:
            wait_until_done(self.db(site), self.ids, timeout)
        self.docs = self._settled(deadline)
        (self.root / "jobs.json").write_text(json.dumps(self.docs, indent=1))  # to look into
        (self.root / "faults.json").write_text(json.dumps(
            [fault.__dict__ for fault in self.fault_log], indent=1))
        ledger = read_ledger(self.ledger)
        audit = audit_run(ledger, self.docs, self.ids, expect, killed=self.dead)
        by_fault = audit_faults(audit, ledger, ledger_times(self.ledger), self.docs,
                                self.fault_log, self.lease, self.origin)
        audit.duplicates = by_fault.explained
        audit.problems += by_fault.unexplained
        audit.problems += self._disagreements(self.docs) + self._daemon_trouble()
        self.notes["duplicates_by_fault"] = by_fault.by_kind
        self.audit = audit
        return audit

    def _settled(self, deadline: float) -> dict[str, Doc]:
        """The jobs merged at the creator once that merge, too, shows every job ended
        and every site's winner agrees with it (or the deadline passed: the audit
        then reports what disagrees). A winner may show an end that a merge with a
        leaf still replicating undoes, for a moment: wait for the sites to settle."""
        while True:
            docs = read_merged_many(self.db(self.alive[0]), self.ids)
            ended = all(doc.get("job_status") for doc in docs.values())
            if (ended and not self._disagreements(docs)) or time.monotonic() > deadline:
                return docs
            time.sleep(0.2)

    def events(self, name: str, detail: str = "") -> list[Doc]:
        """The history events of that name (and with `detail` in theirs) of every job."""
        return [entry for doc in self.docs.values() for entry in doc["history"]
                if entry["event"] == name and detail in (entry.get("detail") or "")]

    def kill_site(self, site: str) -> None:
        """SIGKILL the site's daemon, then stop its server: gone for good, mid-step."""
        os.kill(self.cluster.daemon_proc(site).pid, signal.SIGKILL)
        self.cluster.stop_site(site)
        self.dead.add(site)

    def restart_daemons(self, offsets: dict[str, float]) -> None:
        """Restart the sites' daemons with their protocol clocks skewed by `offsets`."""
        for site, offset in offsets.items():
            self.cluster.daemon_proc(site).stop()
            self.cluster.start_daemon(site, env={"JOBDIST_CLOCK_OFFSET": str(offset)})

    def restarted_server(self, site: str, old_pid: int, timeout: float = 60.0) -> float:
        """Wait until the site's supervisor has a new server answering; seconds it took."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            try:
                if self.cluster.server_pid(site) != old_pid and self.db(site).exists():
                    return time.monotonic() - started
            except (OSError, ValueError, CouchError):
                pass  # the pid file is being written, or the server is not up yet
            time.sleep(0.1)
        raise AssertionError(f"the server of {site} did not come back in {timeout} s")

    def _disagreements(self, docs: dict[str, Doc]) -> list[str]:
        ended = {doc_id: doc["job_status"] for doc_id, doc in docs.items()}
        problems = []
        for site in self.alive:
            for doc in self.db(site).bulk_get(self.ids):
                if doc["job_status"] != ended.get(doc["_id"]):
                    problems.append(f"{doc['_id']} ended {doc['job_status']} at {site}, "
                                    f"{ended.get(doc['_id'])} at the creator")
        return problems

    def _daemon_lines(self) -> Iterator[tuple[str, str, str]]:
        """(site, file, line) of every site's daemon log and stderr."""
        for site in self.cluster.sites:
            for name in ("daemon.log", "daemon.err"):
                path = self.cluster.site_dir(site) / name
                lines = path.read_text(errors="replace").splitlines() if path.exists() else []
                yield from ((site, name, line) for line in lines)

    def _daemon_trouble(self) -> list[str]:
        """A daemon that died, or logged an error or a traceback (stderr included)."""
        problems = [f"the daemon of {site} is not running" for site in self.alive
                    if not self.cluster.daemon_proc(site).alive()]
        return problems + [f"{site} {name}: {line[:200]}" for site, name, line in
                           self._daemon_lines()
                           if " ERROR " in line or line.startswith("Traceback")]

    def journal_replayed(self) -> int:
        """Results the daemons held in their journals while CouchDB was down, then wrote."""
        return sum("held result written" in line for _, _, line in self._daemon_lines())

    def summary(self) -> dict[str, Any]:
        audit = self.audit
        return {
            "scenario": self.name,
            "seed": self.seed,
            "seconds": round(time.monotonic() - self.started, 1),
            "trials": self.rounds,
            "faults": dict(self.faults),
            "jobs": len(self.ids),
            "runs": audit.runs if audit else None,
            "lost": len(audit.lost) if audit else None,
            "duplicates_explained": len(audit.duplicates) if audit else None,
            "journal_replayed": self.journal_replayed(),
            "problems": audit.problems if audit else ["did not finish"],
            "duplicates": audit.duplicates if audit else [],
            **self.notes,
        }


@contextmanager
def trial(name: str, seed: int, tmp_path: Path, summaries: list[dict[str, Any]], *,
          sites: int = 3, in_memory: bool = True, proxied: bool = True,
          **options: Any) -> Iterator[Trial]:
    """A started cluster of `sites` sites for one scenario; always stopped afterwards.

    `proxied` puts a FaultProxy on every replication link, shaped as the regions
    of the design are apart (40 or 120 ms one way, jitter, 1 MB/s); `options` go to
    write_sites (workers, lease, booking_timeout, ...). The summary is recorded,
    written to tmp_path/summary.json and logged however the scenario ends.
    """
    log.warning("scenario %s seed=%d (replay: %s=%d)", name, seed, SEED_VARIABLE, seed)
    with contextlib.ExitStack() as stack:
        options = {"lease": LEASE, **options}
        if proxied:
            sites_dir, links = stack.enter_context(proxied_sites(
                tmp_path / "sites", sites, regions_apart, **options))
        else:
            sites_dir, links = write_sites(tmp_path / "sites", sites, **options), {}
        cluster = LocalCluster(sites_dir, tmp_path / "state", in_memory=in_memory)
        run = Trial(name, seed, tmp_path, cluster, links=links, lease=options["lease"])
        try:
            cluster.up()
            yield run
        finally:
            cluster.down()
            summary = run.summary()
            summaries.append(summary)
            (tmp_path / "summary.json").write_text(json.dumps(summary, indent=2))
            log.warning("summary %s", json.dumps(summary))


# --- the fault storm -------------------------------------------------------------

# A slowed link: 300 ms one way, jitter, 200 kB/s; still well within the lease.
SLOWED = LinkShape(0.3, 0.1, 200_000.0)
LONG = (LEASE + MARGIN + 2.0, LEASE + MARGIN + 4.0)  # past the lease, with margins
CUT_COOLDOWN = 15.0  # a cut link is not cut again this soon: its replicator's back-off resets

# How often each kind is drawn: faults that must cost no re-run outnumber those that
# may, so a duplicate near only the former stands out.
STORM_KINDS: dict[str, float] = {
    "links slowed": 3.0,
    "daemon SIGSTOP, within the lease": 3.0,
    "CouchDB SIGKILL": 1.5,
    "pair cut": 1.5,
    "site isolated, within the lease": 1.0,
    "daemon SIGKILL": 1.5,
    "daemon SIGSTOP, past the lease": 0.6,
    "site isolated, past the lease": 0.4,
}


@dataclass
class Injection:
    """A fault planned in the storm's thread (from its seeded randomness) and carried
    out in a thread of its own, so faults overlap."""

    kind: str
    sites: tuple[str, ...]
    resources: set[str]  # held until healed: no two faults on one daemon, server or link
    seconds: float
    act: Callable[[Injection], None]


class Storm:
    """Random, overlapping faults of every STORM_KINDS kind while bursts of jobs
    arrive at random creators; each fault healed after its time."""

    def __init__(self, run: Trial) -> None:
        self.run = run
        self.rng = run.rng
        self.busy: set[str] = set()
        self.cut_until: dict[Link, float] = {}  # link -> when it may be cut again
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []

    def blow(self, seconds: float, burst_every: tuple[float, float] = (3.0, 6.0),
             burst_jobs: tuple[int, int] = (5, 14), pause: tuple[float, float] = (0.03, 0.25),
             kinds: dict[str, float] = STORM_KINDS) -> None:
        """Inject faults for `seconds`, a try every `pause`, and submit a burst of jobs
        every `burst_every`; then wait until every fault is healed."""
        end = time.monotonic() + seconds
        next_burst = time.monotonic()
        try:
            while time.monotonic() < end:
                if time.monotonic() >= next_burst:
                    self._burst(self.rng.randint(*burst_jobs))
                    next_burst = time.monotonic() + self.rng.uniform(*burst_every)
                kind = self.rng.choices(list(kinds), weights=list(kinds.values()))[0]
                injection = self._plan(kind)
                if injection is not None:
                    self._start(injection)
                time.sleep(self.rng.uniform(*pause))
        finally:
            for thread in self.threads:
                thread.join()
            self.threads.clear()
            self.run.rounds += 1

    def _burst(self, count: int) -> None:
        creator = self.rng.choice(self.run.alive)
        jobs = [self.run.steps(self.rng.randint(1, 3), self._step_seconds())
                for _ in range(count)]
        try:
            self.run.submit(jobs, creator)
        except (CouchError, OSError) as error:  # its server is being killed: next burst
            log.warning("burst of %d jobs at %s not submitted: %s", count, creator, error)

    def _step_seconds(self) -> tuple[float, float]:
        """Mostly short steps; some outlive the lease, so only heartbeats keep them."""
        return (LEASE + 1.0, LEASE + 2.0) if self.rng.random() < 0.05 else (0.2, 1.5)

    def _start(self, injection: Injection) -> None:
        self.busy |= injection.resources
        thread = threading.Thread(target=self._carry_out, args=(injection,),
                                  name=f"fault {injection.kind}", daemon=True)
        self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        thread.start()

    def _carry_out(self, injection: Injection) -> None:
        try:
            injection.act(injection)
        except Exception as error:  # a fault the storm could not inject or heal
            self.errors.append(f"{injection.kind} {injection.sites}: {error!r}")
            log.exception("fault %s on %s failed", injection.kind, injection.sites)
        finally:
            with self.lock:
                self.busy -= injection.resources

    def _free(self, resources: set[str]) -> bool:
        with self.lock:
            return not resources & self.busy

    def _plan(self, kind: str) -> Injection | None:
        """The fault of that kind on random free sites or links; None if none is free."""
        sites = self.run.alive
        site = self.rng.choice(sites)
        match kind:
            case "daemon SIGKILL":
                return self._maybe(Injection(kind, (site,), {f"daemon {site}", f"server {site}"},
                                             self.rng.uniform(0.0, 1.0), self._kill_daemon))
            case "daemon SIGSTOP, within the lease":
                return self._maybe(Injection(kind, (site,), {f"daemon {site}"},
                                             self.rng.uniform(0.3, LEASE / 4), self._pause))
            case "daemon SIGSTOP, past the lease":
                return self._maybe(Injection(kind, (site,), {f"daemon {site}"},
                                             self.rng.uniform(*LONG), self._pause))
            case "CouchDB SIGKILL":
                return self._maybe(Injection(kind, (site,), {f"server {site}"}, 0.0,
                                             self._kill_server))
            case "links slowed":
                pair = tuple(self.rng.sample(sites, 2))
                return self._maybe(Injection(kind, pair, _link_names(_both_ways(*pair)),
                                             self.rng.uniform(1.0, 4.0), self._slow))
            case "pair cut":
                pair = tuple(self.rng.sample(sites, 2))
                return self._cut(kind, pair, _both_ways(*pair), self.rng.uniform(1.0, 3.0))
            case "site isolated, within the lease":
                return self._cut(kind, (site,), self._links_of(site), self.rng.uniform(0.3, 1.0))
            case "site isolated, past the lease":
                return self._cut(kind, (site,), self._links_of(site), self.rng.uniform(*LONG))
        raise ValueError(f"unknown fault kind {kind!r}")

    def _maybe(self, injection: Injection) -> Injection | None:
        return injection if self._free(injection.resources) else None

    def _cut(self, kind: str, sites: tuple[str, ...], links: list[Link],
             seconds: float) -> Injection | None:
        """One cut at a time (two pair cuts would isolate a site with no fault saying
        so), on links whose replicators have had time to reset their back-off."""
        now = time.monotonic()
        if any(self.cut_until.get(link, 0.0) > now for link in links):
            return None
        injection = self._maybe(Injection(kind, sites, {"cut", *_link_names(links)}, seconds,
                                          lambda i: self._isolate(i, links)))
        if injection is not None:
            self.cut_until.update(dict.fromkeys(links, now + seconds + CUT_COOLDOWN))
        return injection

    def _links_of(self, site: str) -> list[Link]:
        return [link for link in self.run.links if site in link]

    # --- the faults themselves, each in its own thread ---------------------------------

    def _kill_daemon(self, injection: Injection) -> None:
        [site] = injection.sites
        os.kill(self.run.cluster.daemon_proc(site).pid, signal.SIGKILL)
        with self.run.injecting(injection.kind, injection.sites,
                                f"restarted after {injection.seconds:.1f} s"):
            time.sleep(injection.seconds)
            self.run.cluster.start_daemon(site)

    def _pause(self, injection: Injection) -> None:
        [site] = injection.sites
        pid = self.run.cluster.daemon_proc(site).pid
        os.kill(pid, signal.SIGSTOP)
        try:
            with self.run.injecting(injection.kind, injection.sites):
                time.sleep(injection.seconds)
        finally:
            os.kill(pid, signal.SIGCONT)

    def _kill_server(self, injection: Injection) -> None:
        [site] = injection.sites
        pid = self.run.cluster.server_pid(site)
        os.kill(pid, signal.SIGKILL)
        with self.run.injecting(injection.kind, injection.sites, "back when its supervisor "
                                "restarted it"):
            self.run.restarted_server(site, pid)

    def _slow(self, injection: Injection) -> None:
        links = _both_ways(*injection.sites)
        with self.run.injecting(injection.kind, injection.sites):
            for link in links:
                self.run.links[link].shape(SLOWED)
            time.sleep(injection.seconds)
            for link in links:
                self.run.links[link].shape(regions_apart(link))

    def _isolate(self, injection: Injection, links: list[Link]) -> None:
        with self.run.injecting(injection.kind, injection.sites):
            for link in links:
                self.run.links[link].cut()
            try:
                time.sleep(injection.seconds)
            finally:
                for link in links:
                    self.run.links[link].restore()


def _both_ways(a: str, b: str) -> list[Link]:
    return [(a, b), (b, a)]


def _link_names(links: list[Link]) -> set[str]:
    return {f"link {a}>{b}" for a, b in links}


CALM = 5.0  # seconds between two storms of a trial: the jobs move on, the faults healed


def storm_trial(name: str, seed: int, root: Path, summaries: list[dict[str, Any]],
                rounds: int, round_seconds: float, timeout: float = 300.0) -> Trial:
    """A cluster regions apart, on disk (its servers are killed), through `rounds`
    storms of `round_seconds` with a CALM between them; then every job ends and the
    run is audited. Returns the trial (its audit and summary filled in)."""
    with trial(name, seed, root, summaries, in_memory=False, booking_timeout=3.0) as run:
        storm = Storm(run)
        for number in range(rounds):
            if number:
                time.sleep(CALM)
            storm.blow(round_seconds)
        run.finish(timeout=timeout)
        assert run.audit is not None
        run.audit.problems += storm.errors
    return run


# --- the table --------------------------------------------------------------------

def fault_table(summaries: list[dict[str, Any]]) -> list[str]:
    """The figures of a set of scenarios, one line each, their totals, the faults by
    kind, and every duplicate with the fault that explains it."""
    lines = [f"{'scenario':<34} {'seed':>7} {'faults':>6} {'jobs':>5} {'runs':>5} "
             f"{'dups':>4} {'replayed':>8} {'lost':>4} {'problems':>8} {'seconds':>7}"]
    totals: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    by_fault: Counter[str] = Counter()
    for s in summaries:
        row = {"faults": sum(s["faults"].values()), "jobs": s["jobs"], "runs": s["runs"] or 0,
               "dups": s["duplicates_explained"] or 0, "replayed": s["journal_replayed"],
               "lost": s["lost"] or 0, "problems": len(s["problems"])}
        totals.update(row)
        kinds.update(s["faults"])
        by_fault.update(s.get("duplicates_by_fault", {}))
        lines.append(f"{s['scenario'][:34]:<34} {s['seed']:>7} {_cells(row)} {s['seconds']:>7}")
    lines.append(f"{'all ' + str(len(summaries)) + ' scenarios':<34} {'':>7} {_cells(totals)} "
                 f"{round(sum(s['seconds'] for s in summaries)):>7}")
    lines.append("faults by kind: " + ", ".join(f"{kind} {n}" for kind, n in kinds.most_common()))
    lines.append("duplicates by the kind of fault that explains them: " + (", ".join(
        f"{kind} {n}" for kind, n in by_fault.most_common()) or "none"))
    for s in summaries:
        lines += [f"  {s['scenario']}: {duplicate}" for duplicate in s["duplicates"]]
        lines += [f"  PROBLEM {s['scenario']} (seed {s['seed']}): {p}" for p in s["problems"]]
    return lines


def _cells(row: Mapping[str, int]) -> str:
    return (f"{row['faults']:>6} {row['jobs']:>5} {row['runs']:>5} {row['dups']:>4} "
            f"{row['replayed']:>8} {row['lost']:>4} {row['problems']:>8}")


# --- the soak ---------------------------------------------------------------------

def soak(minutes: float, seed: int, round_seconds: float = 60.0, rounds: int = 3,
         work_dir: Path | None = None,
         on_trial: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Storm trials one after another (fresh sites each, seeds seed, seed+1, ...), a new
    one started as long as `minutes` have not passed; their summaries, each passed to
    `on_trial` as it ends. A trial whose jobs do not end in time is a problem of its
    summary, and the soak goes on."""
    summaries: list[dict[str, Any]] = []
    deadline = time.monotonic() + minutes * 60
    number = 0
    while time.monotonic() < deadline:
        number += 1
        name, before = f"soak storm {number}", len(summaries)
        with tempfile.TemporaryDirectory(prefix="jobdist-soak-", dir=work_dir) as tmp:
            try:
                storm_trial(name, seed + number - 1, Path(tmp), summaries, rounds, round_seconds)
            except (TimeoutError, AssertionError, JobdistError) as error:
                if len(summaries) == before:  # no sites directory even: nothing to soak
                    raise
                summaries[-1]["problems"].append(f"the trial stopped: {error}")
        if on_trial:
            on_trial(summaries[-1])
    return summaries
