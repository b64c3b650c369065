"""The ledger audit: every run a step's command recorded, explained by its job's history.

Every step of the lab's jobs appends `start`/`end` lines to a ledger file
(scenarios.ledger_command). `audit_run` checks a run against it: every step ran
exactly once, on a site its target allows, the steps of a job in order; under
faults, a step that ran again did so in a new epoch and the job's history says
why (why_superseded).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..model import Doc, Leaf, allows, counting_runs, is_broadcast

LedgerRow = tuple[str, str, int, str, int]  # (kind, job id, step, site, epoch)


def read_ledger(path: Path) -> list[LedgerRow]:
    """(kind, job id, step, site, epoch) per line."""
    rows = []
    for line in _ledger_lines(path):
        kind, job_id, step, site, epoch = line.split()[:5]
        rows.append((kind, job_id, int(step), site, int(epoch)))
    return rows


def ledger_times(path: Path) -> list[float]:
    """The Unix time each line of the ledger was written, in read_ledger's order."""
    return [float(line.split()[5]) for line in _ledger_lines(path)]


def _ledger_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


Run = tuple[int, int, str]  # (step, epoch, site): one execution, by its fencing token


@dataclass
class Audit:
    """The promises of a run, checked from its ledger and its jobs' final documents."""

    jobs: int
    lost: list[str] = field(default_factory=list)  # submitted jobs missing or never ended
    problems: list[str] = field(default_factory=list)  # broken promises, lost jobs included
    duplicates: list[str] = field(default_factory=list)  # extra runs, each with its reason
    runs: int = 0  # step executions the ledger shows
    # The extra runs themselves (job id, run), in `duplicates`' order: the fault
    # audit (jobdist.lab.faultlog) names the fault behind each.
    extra_runs: list[tuple[str, Run]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def audit_run(ledger: list[LedgerRow], docs: Mapping[str, Doc], submitted: list[str],
              expect: str | None = "success", killed: Collection[str] = ()) -> Audit:
    """Check a run: no job lost, every job ended as `expect`ed (None: any end), the
    steps of a job ran in order, each on a site its target allows, and each step
    that counted ran once. Any other run of a step is a duplicate: allowed only
    with a fencing token of its own and when the history says why (`why_superseded`),
    or when it ran on a site `killed` for good, whose record of it died with it.

    The fencing token is the epoch and the site (core.backs_execution): after a
    revocation, a site on the losing side of a partition may issue an epoch number
    that a site on the other side issues too.
    """
    audit = Audit(jobs=len(submitted), runs=sum(row[0] == "start" for row in ledger))
    runs: dict[str, list[tuple[int, LedgerRow]]] = collections.defaultdict(list)
    for line, row in enumerate(ledger):
        runs[row[1]].append((line, row))
    for job_id in submitted:
        doc = docs.get(job_id)
        if doc is None or not doc.get("job_status"):
            audit.lost.append(job_id)
            audit.problems.append(f"{job_id} {'missing' if doc is None else 'never ended'}")
            continue
        if expect is not None and doc["job_status"] != expect:
            audit.problems.append(f"{job_id} ended {doc['job_status']}, expected {expect}")
        _audit_job(doc, runs.pop(job_id, []), audit, killed)
    audit.problems += [f"{job_id} ran but was never submitted" for job_id in runs]
    return audit


@dataclass
class JobRuns:
    """One job's executions in the ledger: the lines that started and ended each."""

    starts: dict[Run, list[int]] = field(default_factory=lambda: collections.defaultdict(list))
    ends: dict[Run, int] = field(default_factory=dict)

    def add(self, line: int, row: LedgerRow) -> None:
        kind, _, step, site, epoch = row
        if kind == "start":
            self.starts[(step, epoch, site)].append(line)
        else:
            self.ends[(step, epoch, site)] = line


def counted(doc: Leaf) -> dict[Run, Leaf]:
    """The executions whose result the job kept: each ended step's, by its winner; for a
    broadcast step, each site's ended sub-run (a dropped site's counts for nothing)."""
    kept: dict[Run, Leaf] = {}
    for index, step in enumerate(doc["job"]):
        if is_broadcast(step):
            kept.update({(index, run["epoch"], site): run
                         for site, run in counting_runs(step).items()
                         if run["status"] in ("finished", "failed")})
        elif step["step_status"] in ("finished", "failed"):
            kept[(index, step["epoch"], step["winner"])] = step
    return kept


def _audit_job(doc: Doc, rows: list[tuple[int, LedgerRow]], audit: Audit,
               killed: Collection[str] = ()) -> None:
    runs = JobRuns()
    for line, row in rows:
        runs.add(line, row)
    audit.problems += _misplaced(doc, runs) + _counted_in_order(doc, runs)
    kept = counted(doc)

    def explain(run: Run) -> str | None:
        return why_superseded(doc["history"], run, explain) or outranked_by_success(doc, run, kept)

    for run in sorted(set(runs.starts) - set(kept)):
        where = f"{doc['_id']} step {run[0]} epoch {run[1]} on {run[2]}"
        reason = explain(run)
        if reason is None and run[2] in killed:
            reason = f"{run[2]} was killed for good: its record of the run died with it"
        takeovers = adoptions(doc["history"])
        if reason is None:
            audit.problems.append(f"{where}: ran, did not count, and the history says nothing")
            continue
        if takeovers and takeovers not in reason:
            reason = f"{reason}; in a job taken over: {takeovers}"
        audit.duplicates.append(f"{where}: {reason}")
        audit.extra_runs.append((doc["_id"], run))


def _misplaced(doc: Doc, runs: JobRuns) -> list[str]:
    """Two executions sharing a fencing token, or a run on a site the target forbids."""
    problems = []
    for (index, epoch, site), lines in runs.starts.items():
        where = f"{doc['_id']} step {index}"
        if len(lines) > 1:
            problems.append(f"{where} ran {len(lines)} times on {site} in epoch {epoch}")
        if index >= len(doc["job"]) or not allows(doc["job"][index], site):
            problems.append(f"{where} ran on {site}, not a target")
    return problems


def _counted_in_order(doc: Doc, runs: JobRuns) -> list[str]:
    """Each ended step has its run (a broadcast step, one per site), started after the
    runs of the step before ended."""
    problems, previous_end = [], -1
    by_step: dict[int, list[tuple[Run, Leaf]]] = collections.defaultdict(list)
    for run, record in sorted(counted(doc).items()):
        by_step[run[0]].append((run, record))
    for index in sorted(by_step):
        ends = [previous_end]
        for run, record in by_step[index]:
            where = f"{doc['_id']} step {index}"
            status = record.get("status", record.get("step_status"))
            if not runs.starts.get(run):
                problems.append(f"{where} {status} with no run in epoch {run[1]} on {run[2]}")
                continue
            line = runs.starts[run][0]
            if line < previous_end:
                problems.append(f"{where} started before step {index - 1} ended")
            if status == "finished" and run not in runs.ends:
                problems.append(f"{where} finished, but its run never ended")
            ends.append(runs.ends.get(run, line))
        previous_end = max(ends)
    return problems


def why_superseded(history: Sequence[Leaf], run: Run,
                   explain_before: Callable[[Run], str | None] | None = None) -> str | None:
    """What the history records about a run that did not count: its stale finish, a
    cancellation in its epoch, a release that ended its epoch (a release moves the
    step to the next epoch) written by its site or naming it (a revoked lease), or
    a finish of the step before that it was chained on, in the same revision by the
    same site, itself superseded; or, in a job taken over by another creator, its own
    end on a branch the merge left: two creators arbitrated it for a while (the old
    one cut off, or back before it saw the adoption), each branch fenced.

    `explain_before` explains the run of the step before that this one followed (by
    default, this function): the audit also counts a run outranked by success there.
    """
    if explain_before is None:
        def explain_before(before: Run) -> str | None:
            return why_superseded(history, before)
    step, epoch, site = run
    for entry in history:
        if entry["step"] == step and _ends_epoch(entry, epoch, site, history):
            return f"{entry['event']} by {entry['site']}: {entry['detail']}"
    takeovers = adoptions(history)
    if takeovers and any((entry["event"], entry["step"], entry["epoch"], entry["site"])
                         in (("finished", *run), ("failed", *run)) for entry in history):
        return f"ended on a branch the merge left, two creators arbitrating: {takeovers}"
    started = [e["at"] for e in history
               if (e["event"], e["step"], e["epoch"], e["site"]) == ("started", *run)]
    for entry in history:
        if (entry["event"], entry["step"], entry["site"]) == ("finished", step - 1, site) and \
                entry["at"] in started:
            reason = explain_before((step - 1, entry["epoch"], site))
            if reason is not None:
                return f"chained on step {step - 1} epoch {entry['epoch']}, {reason}"
    return _after_superseded_finish(history, run, min(started, default=None), explain_before)


def outranked_by_success(doc: Doc, run: Run, kept: Mapping[Run, Leaf]) -> str | None:
    """A run in a later epoch than the step's counted run, which the history shows
    revoked: the revoked run finished anyway, and the leaf where the job succeeded
    outranks the branch of the release and this run (core.leaves.succeeded; protocol.md)."""
    if doc.get("job_status") != "success":
        return None
    for step, epoch, site in kept:
        if step == run[0] and epoch < run[1]:
            revoked = why_superseded(doc["history"], (step, epoch, site))
            if revoked is not None:
                return (f"step {step} epoch {epoch} on {site} finished though revoked "
                        f"({revoked}); the leaf where the job succeeded outranks this run's")
    return None


def _after_superseded_finish(history: Sequence[Leaf], run: Run, started: str | None,
                             explain_before: Callable[[Run], str | None]) -> str | None:
    """A run started on another site's finish of the step before, the last one recorded
    before it, which was itself superseded: its branch was a cut-off side's (a creator
    cut off revoked that finish's lease and ran the step again on its own side)."""
    step = run[0]
    before = [entry for entry in history if started is not None and entry["at"] <= started
              and (entry["event"], entry["step"]) == ("finished", step - 1)]
    if not before:
        return None
    last = before[-1]
    reason = explain_before((step - 1, last["epoch"], last["site"]))
    if reason is None:
        return None
    return f"ran after step {step - 1} epoch {last['epoch']} on {last['site']}, {reason}"


def adoptions(history: Sequence[Leaf]) -> str:
    """The job's changes of creator, as the history gives them ("" when none)."""
    return "; ".join(f"{entry['detail']} (term {entry['epoch']})" for entry in history
                     if entry["event"] == "adopted")


def _ends_epoch(entry: Leaf, epoch: int, site: str, history: Sequence[Leaf]) -> bool:
    """Does this event of the run's step end the run's epoch?"""
    names = entry["site"] == site or site in (entry.get("detail") or "")
    match entry["event"]:
        case "stale_finish":
            return entry["epoch"] == epoch and names
        case "cancelled":
            return entry["epoch"] == epoch
        case "released":
            return names and (entry["epoch"] == epoch + 1
                              or _released_over(entry, epoch, site, history))
        case "dropped":  # an operator removed the site from a broadcast step, for good
            return (entry.get("detail") or "").startswith(f"{site}: ")
    return False


def _released_over(release: Leaf, epoch: int, site: str, history: Sequence[Leaf]) -> bool:
    """A release that went more than one epoch up ends the site's run in `epoch` when the
    site had no later win or start at the step below it: a new epoch goes above every
    one the step's history shows (edits.next_step_epoch), another branch's included."""
    if release["epoch"] <= epoch + 1:
        return False
    return not any(entry["step"] == release["step"]
                   and epoch < entry["epoch"] < release["epoch"]
                   and ((entry["event"] == "started" and entry["site"] == site)
                        or (entry["event"] == "won" and site in (entry.get("detail") or "")))
                   for entry in history)
