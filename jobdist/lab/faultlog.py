"""The fault log of a fault-injection run, and the strict audit of its duplicate runs.

Pure functions over what a run recorded: the faults it injected (kind, sites, from
when to when, Unix times), the ledger its steps wrote (each line with its time)
and the jobs' final documents. A duplicate run (a start whose run did not count)
is allowed only when its history explains it (audit.why_superseded) *and* an
injected fault made it unavoidable: a daemon killed, or stopped or cut off for
longer than the lease, near the run, on a site the step ran on; a creator lost or
cut off under succession; a clock skewed beyond the margin. A CouchDB outage
shorter than the lease (its results are journaled), a daemon paused and resumed
within the lease, a slow link or a pair cut (the third site relays) explains
nothing: a duplicate with only those around it is a failure.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..model import Doc
from .audit import Audit, LedgerRow, Run


class Effect(enum.Enum):
    """When a fault makes a re-run unavoidable."""

    ALWAYS = "always"  # its site's workers are lost, or two creators arbitrate
    IF_LONGER_THAN_LEASE = "if longer than the lease"  # the creator revokes a silent lease
    NEVER = "never"  # must cost no re-run


# Faults whose effect is on the job's creator (or creators under succession), not
# on the sites that ran the step: their duplicates may run anywhere, in jobs whose
# creators include the fault's site, for as long as two branches stay unmerged.
CREATOR_FAULTS = frozenset({"creator killed for good", "creator cut off",
                            "successor killed for good"})

# Faults that, on a job's creator, hit the runs of every site: cut off, the creator
# hears no renewal and revokes every lease it gave.
DEAFEN_CREATOR = frozenset({"site isolated, within the lease", "site isolated, past the lease"})

# Faults that stop replication to or from a site. pouchdb-server's replicator backs
# off exponentially while it fails, so after failing for d seconds its next try may
# come up to d later: such a fault's effects may last that long after it is healed.
STOP_REPLICATION = frozenset({"CouchDB SIGKILL", "pair cut", "creator site down",
                              "creator cut off", *DEAFEN_CREATOR})

EFFECTS: dict[str, Effect] = {
    "daemon SIGKILL": Effect.ALWAYS,
    "daemon SIGKILL, down past the lease": Effect.ALWAYS,
    "site killed for good": Effect.ALWAYS,
    "creator site down": Effect.ALWAYS,
    "clock skew beyond margin": Effect.ALWAYS,
    **dict.fromkeys(CREATOR_FAULTS, Effect.ALWAYS),
    "daemon SIGSTOP, within the lease": Effect.IF_LONGER_THAN_LEASE,
    "daemon SIGSTOP, past the lease": Effect.IF_LONGER_THAN_LEASE,
    "site isolated, within the lease": Effect.IF_LONGER_THAN_LEASE,
    "site isolated, past the lease": Effect.IF_LONGER_THAN_LEASE,
    "CouchDB SIGKILL": Effect.IF_LONGER_THAN_LEASE,
    "pair cut": Effect.NEVER,
    "links slowed": Effect.NEVER,
    "clock skew within margin": Effect.NEVER,
}


@dataclass
class Fault:
    """One injection: counted once, whatever it overlaps."""

    number: int
    kind: str  # a key of EFFECTS (any other kind explains nothing)
    sites: tuple[str, ...]  # the sites it hits (a cut link: both ends)
    start: float  # Unix time
    end: float | None = None  # when healed; None: never (or not yet)
    detail: str = ""

    @property
    def seconds(self) -> float:
        return math.inf if self.end is None else self.end - self.start

    def describe(self, origin: float) -> str:
        """`fault #17 daemon SIGKILL reg_a at 12.3 s for 1.1 s`, times from `origin`."""
        length = "" if self.end is None else f" for {self.seconds:.1f} s"
        if self.end is not None and self.kind in STOP_REPLICATION:
            length += f" (replication stopped up to {replication_stopped(self):.1f} s)"
        detail = f" ({self.detail})" if self.detail else ""
        return (f"fault #{self.number} {self.kind} {','.join(self.sites)} at "
                f"{self.start - origin:.1f} s{length}{detail}")


def makes_reruns_unavoidable(fault: Fault, lease: float) -> bool:
    """Can this fault, by itself, make a step run again? Judged on how long it
    actually lasted (a pause meant to be short that a loaded machine stretched past
    the lease counts as long), and for one that stopped replication, on how long
    replication may have stayed stopped (`replication_stopped`)."""
    effect = EFFECTS.get(fault.kind, Effect.NEVER)
    return effect is Effect.ALWAYS or (
        effect is Effect.IF_LONGER_THAN_LEASE and replication_stopped(fault) > lease)


# The longest a failing replication waits before it tries again (our patch to
# pouchdb-server's replicator; patches/pouchdb-replication+7.3.1.patch).
REPLICATION_RETRY_SECONDS = 1.0


def replication_stopped(fault: Fault) -> float:
    """How long the fault may have kept its site's documents from reaching the others
    or theirs from reaching it: for a fault that stops replication, as long as it
    lasted and the replicator's next try after it. (Before the replicator retried at
    least once a second, its back-off doubled while it failed: a winner whose
    CouchDB was down for 4.8 s of a 6 s lease got its `won` 8.5 s after the creator
    wrote it, and lost it.)"""
    if fault.kind in STOP_REPLICATION:
        return fault.seconds + REPLICATION_RETRY_SECONDS
    return fault.seconds


@dataclass(frozen=True)
class Span:
    """One execution as the ledger shows it: where, and from when to when (Unix times;
    end None when it never wrote its end: killed by its site, or its site died)."""

    site: str
    start: float
    end: float | None


@dataclass(frozen=True)
class ExtraRun:
    """A duplicate run with what the fault audit needs around it."""

    job: str
    run: Run
    span: Span
    step_spans: tuple[Span, ...]  # every execution of the same step, this one included
    before_spans: tuple[Span, ...]  # every execution of the step before (a run may
    # have started on its superseded finish)
    creators: frozenset[str]  # the job's creator and every site that adopted it
    taken_over: bool


def explaining_fault(extra: ExtraRun, faults: Sequence[Fault], lease: float) -> Fault | None:
    """The injected fault that made this duplicate unavoidable, the nearest in time
    to the run's start; None when no fault in the log can have.

    A site fault (a daemon killed or stopped, a site cut off) explains a run when it
    hit a site that ran the step or the step before (a run started on a superseded
    finish), or the job's creator when it cut the creator off, and was under way
    (or `settled` not yet) while the run was, or up to a lease before it started (a
    run chained on its site's superseded finish of the step before) or after it ended
    (its finish not yet written, or not yet replicated). A creator fault (succession) explains any
    run of a job taken over by another creator, once it began: the two creators'
    branches stay until they merge.
    """
    window = (extra.span.start - lease, _ended(extra) + lease)
    ran = {span.site for span in extra.step_spans + extra.before_spans}
    candidates = [
        fault for fault in faults if makes_reruns_unavoidable(fault, lease) and (
            (_hits(fault, extra, ran) and _overlaps(fault, window))
            or (fault.kind in CREATOR_FAULTS and _explains_by_creator(fault, extra, window)))]
    return min(candidates, key=lambda fault: abs(fault.start - extra.span.start), default=None)


def _hits(fault: Fault, extra: ExtraRun, ran: set[str]) -> bool:
    """Did the fault hit a site that ran the step or the step before, or cut the job's
    creator off from every site?"""
    hit = ran | (extra.creators if fault.kind in DEAFEN_CREATOR else set())
    return bool(hit & set(fault.sites))


def _ended(extra: ExtraRun) -> float:
    """When the run ended, or, if it never wrote its end, when the last execution of its
    step started (a run killed by its site was revoked before that one began)."""
    if extra.span.end is not None:
        return extra.span.end
    return max((span.start for span in extra.step_spans), default=extra.span.start)


def _overlaps(fault: Fault, window: tuple[float, float]) -> bool:
    return fault.start <= window[1] and settled(fault) >= window[0]


def settled(fault: Fault) -> float:
    """When the fault's effects end: when it was healed, or, for one that stopped
    replication, once the replicator tried again after that."""
    return fault.start + replication_stopped(fault)


def _explains_by_creator(fault: Fault, extra: ExtraRun, window: tuple[float, float]) -> bool:
    return extra.taken_over and bool(extra.creators & set(fault.sites)) and \
        fault.start <= window[1]


def spans(ledger: Sequence[LedgerRow], times: Sequence[float]) -> dict[tuple[str, Run], Span]:
    """Every execution in the ledger, by (job id, run), with its start and end times."""
    starts: dict[tuple[str, Run], float] = {}
    ends: dict[tuple[str, Run], float] = {}
    for (kind, job, step, site, epoch), at in zip(ledger, times, strict=True):
        key = (job, (step, epoch, site))
        if kind == "start":
            starts.setdefault(key, at)
        else:
            ends[key] = at
    return {key: Span(key[1][2], start, ends.get(key)) for key, start in starts.items()}


def extra_runs(audit: Audit, ledger: Sequence[LedgerRow], times: Sequence[float],
               docs: Mapping[str, Doc]) -> list[ExtraRun]:
    """The audit's duplicate runs, each with its spans and its job's creators."""
    executions = spans(ledger, times)
    extras = []
    for job, run in audit.extra_runs:
        history = docs[job]["history"]
        adopters = {entry["site"] for entry in history if entry["event"] == "adopted"}
        extras.append(ExtraRun(job, run, executions[(job, run)],
                               _spans_of(executions, job, run[0]),
                               _spans_of(executions, job, run[0] - 1),
                               frozenset({docs[job]["creator"], *adopters}), bool(adopters)))
    return extras


def _spans_of(executions: Mapping[tuple[str, Run], Span], job: str, step: int) -> tuple[Span, ...]:
    return tuple(span for (other, (index, _, _)), span in executions.items()
                 if other == job and index == step)


@dataclass(frozen=True)
class FaultAudit:
    """Each duplicate with the fault that explains it; those no fault explains."""

    explained: list[str]
    unexplained: list[str]
    by_kind: dict[str, int]  # duplicates per kind of the fault that explains them


def audit_faults(audit: Audit, ledger: Sequence[LedgerRow], times: Sequence[float],
                 docs: Mapping[str, Doc], faults: Sequence[Fault], lease: float,
                 origin: float) -> FaultAudit:
    """Match every duplicate the history explains to the fault that made it
    unavoidable: both must hold (times in the text are seconds from `origin`)."""
    explained, unexplained, by_kind = [], [], dict[str, int]()
    for extra, reason in zip(extra_runs(audit, ledger, times, docs), audit.duplicates,
                             strict=True):
        fault = explaining_fault(extra, faults, lease)
        if fault is None:
            unexplained.append(f"{reason}; but no injected fault makes it unavoidable "
                               f"(run from {_when(extra.span.start, origin)} to "
                               f"{_when(extra.span.end, origin)})")
        else:
            explained.append(f"{reason}; explained by {fault.describe(origin)}")
            by_kind[fault.kind] = by_kind.get(fault.kind, 0) + 1
    return FaultAudit(explained, unexplained, by_kind)


def _when(at: float | None, origin: float) -> str:
    return "no end" if at is None else f"{at - origin:.1f} s"
