"""What every fault scenario shares: a local cluster on short leases (optionally
with a fault proxy on every replication link), seeded random jobs whose steps
write the ledger, the end-of-run audit (jobdist.lab.scenarios.audit_run) and the
scenario's summary.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobdist.client import read_merged_many
from jobdist.couch import Database, Saved
from jobdist.lab.cluster import LocalCluster
from jobdist.lab.proxy import FaultProxy
from jobdist.lab.scenarios import (
    Audit,
    Link,
    audit_run,
    ledger_command,
    proxied_sites,
    read_ledger,
    regions_apart,
    site_db,
    wait_until_done,
    write_sites,
)
from jobdist.model import Doc, new_job, new_step

log = logging.getLogger("jobdist.faults")

LEASE = 6.0  # write_sites derives heartbeat 1.5 s and clock-skew margin 1 s from it
TARGETS: tuple[str | list[str], ...] = (
    "any", "any", "global", "reg_a", "reg_b", ["reg_a", "reg_b"], ["global", "reg_b"])


@dataclass
class Trial:
    """One scenario's run: its cluster, randomness, jobs, ledger and fault counts."""

    name: str
    seed: int
    root: Path
    cluster: LocalCluster
    links: dict[Link, FaultProxy] = field(default_factory=dict)
    faults: Counter[str] = field(default_factory=Counter)
    ids: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    audit: Audit | None = None
    docs: dict[str, Doc] = field(default_factory=dict)  # the jobs as they ended, merged
    rounds: int = 0
    dead: set[str] = field(default_factory=set)  # sites killed for good: not waited for

    @property
    def alive(self) -> list[str]:
        return [site for site in sorted(self.cluster.sites) if site not in self.dead]

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.ledger = self.root / "ledger.txt"
        self.started = time.monotonic()

    def db(self, site: str = "global") -> Database:
        return site_db(self.cluster, site)

    def fault(self, kind: str, detail: str = "") -> None:
        self.faults[kind] += 1
        log.warning("fault %s %s at %.1fs", kind, detail, time.monotonic() - self.started)

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
        """Wait until every site alive sees every job ended, then audit the run."""
        deadline = time.monotonic() + timeout
        for site in self.alive:
            wait_until_done(self.db(site), self.ids, timeout)
        self.docs = self._settled(deadline)
        (self.root / "jobs.json").write_text(json.dumps(self.docs, indent=1))  # to look into
        self.audit = audit_run(read_ledger(self.ledger), self.docs, self.ids, expect,
                               killed=self.dead)
        self.audit.problems += self._disagreements(self.docs) + self._daemon_trouble()
        return self.audit

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

    def _disagreements(self, docs: dict[str, Doc]) -> list[str]:
        ended = {doc_id: doc["job_status"] for doc_id, doc in docs.items()}
        problems = []
        for site in self.alive:
            for doc in self.db(site).bulk_get(self.ids):
                if doc["job_status"] != ended.get(doc["_id"]):
                    problems.append(f"{doc['_id']} ended {doc['job_status']} at {site}, "
                                    f"{ended.get(doc['_id'])} at the creator")
        return problems

    def _daemon_trouble(self) -> list[str]:
        """A daemon that died, or logged an error or a traceback (stderr included)."""
        problems = [f"the daemon of {site} is not running" for site in self.alive
                    if not self.cluster.daemon_proc(site).alive()]
        for site in self.cluster.sites:
            for name in ("daemon.log", "daemon.err"):
                path = self.cluster.site_dir(site) / name
                lines = path.read_text(errors="replace").splitlines() if path.exists() else []
                problems += [f"{site} {name}: {line[:200]}" for line in lines
                             if " ERROR " in line or line.startswith("Traceback")]
        return problems

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
    log.warning("scenario %s seed=%d", name, seed)
    with contextlib.ExitStack() as stack:
        options = {"lease": LEASE, **options}
        if proxied:
            sites_dir, links = stack.enter_context(proxied_sites(
                tmp_path / "sites", sites, regions_apart, **options))
        else:
            sites_dir, links = write_sites(tmp_path / "sites", sites, **options), {}
        cluster = LocalCluster(sites_dir, tmp_path / "state", in_memory=in_memory)
        run = Trial(name, seed, tmp_path, cluster, links=links)
        try:
            cluster.up()
            yield run
        finally:
            cluster.down()
            summary = run.summary()
            summaries.append(summary)
            (tmp_path / "summary.json").write_text(json.dumps(summary, indent=2))
            log.warning("summary %s", json.dumps(summary))
