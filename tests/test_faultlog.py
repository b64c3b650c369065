"""The strict fault audit (jobdist.lab.faultlog): each duplicate run matched to the
injected fault that made it unavoidable, by site, time and how long the fault
lasted. Pure: ledgers, fault logs and final documents written by hand."""

from __future__ import annotations

from jobdist.lab.faultlog import (
    Fault,
    Span,
    audit_faults,
    explaining_fault,
    extra_runs,
    makes_reruns_unavoidable,
    spans,
)
from jobdist.lab.scenarios import LedgerRow, audit_run
from jobdist.model import Doc

LEASE = 6.0
T0 = 1_000.0  # the run's origin, Unix time


def event(name: str, step: int, epoch: int, site: str, detail: str | None = None) -> Doc:
    return {"event": name, "step": step, "epoch": epoch, "site": site, "detail": detail,
            "at": "2026-11-23T00:00:00.000000Z"}


def job_revoked_on_reg_a() -> Doc:
    """One step: run on reg_a in epoch 1, whose lease the creator revoked; run again
    on reg_b in epoch 2, which counted."""
    return {"_id": "j1", "creator": "global", "job_status": "success",
            "job": [{"step_status": "finished", "epoch": 2, "winner": "reg_b",
                     "target": "any"}],
            "history": [event("started", 0, 1, "reg_a"),
                        event("released", 0, 2, "global", "lease of reg_a expired at ..."),
                        event("started", 0, 2, "reg_b"),
                        event("finished", 0, 2, "reg_b")]}


LEDGER: list[LedgerRow] = [("start", "j1", 0, "reg_a", 1), ("start", "j1", 0, "reg_b", 2),
                           ("end", "j1", 0, "reg_b", 2)]
TIMES = [T0 + 10.0, T0 + 19.0, T0 + 20.0]  # reg_a's run never wrote its end


def fault(kind: str, sites: tuple[str, ...], start: float, seconds: float | None,
          number: int = 1) -> Fault:
    return Fault(number, kind, sites, T0 + start,
                 None if seconds is None else T0 + start + seconds)


def audited(faults: list[Fault]) -> tuple[list[str], list[str]]:
    docs = {"j1": job_revoked_on_reg_a()}
    audit = audit_run(LEDGER, docs, ["j1"])
    assert audit.problems == [] and len(audit.duplicates) == 1  # the history explains it
    result = audit_faults(audit, LEDGER, TIMES, docs, faults, LEASE, T0)
    return result.explained, result.unexplained


def test_the_daemon_stopped_past_the_lease_on_the_runs_site_explains_it_by_name() -> None:
    explained, unexplained = audited([
        fault("links slowed", ("reg_a", "reg_b"), 9.0, 3.0, number=4),
        fault("daemon SIGSTOP, past the lease", ("reg_a",), 11.0, 9.5, number=5)])
    assert unexplained == []
    [line] = explained
    assert "lease of reg_a expired" in line  # the history's reason, kept
    assert line.endswith("explained by fault #5 daemon SIGSTOP, past the lease reg_a "
                         "at 11.0 s for 9.5 s")


def test_a_pause_within_the_lease_or_a_short_couchdb_outage_explains_nothing() -> None:
    explained, [problem] = audited([
        fault("daemon SIGSTOP, within the lease", ("reg_a",), 11.0, 1.2),
        fault("CouchDB SIGKILL", ("reg_a",), 12.0, 2.1),
        fault("pair cut", ("reg_a", "global"), 12.5, 3.0),
        fault("links slowed", ("reg_a", "global"), 13.0, 3.0)])
    assert explained == []
    assert "no injected fault makes it unavoidable (run from 10.0 s to no end)" in problem


def test_a_pause_meant_short_that_lasted_past_the_lease_counts_as_long() -> None:
    stretched = fault("daemon SIGSTOP, within the lease", ("reg_a",), 11.0, LEASE + 0.5)
    assert makes_reruns_unavoidable(stretched, LEASE)
    assert not makes_reruns_unavoidable(fault("site isolated, within the lease", ("reg_a",),
                                              0.0, LEASE - 0.5), LEASE)
    assert audited([stretched])[1] == []


def test_a_fault_on_another_site_or_long_before_the_run_explains_nothing() -> None:
    assert audited([fault("daemon SIGKILL", ("global",), 11.0, 1.0)])[0] == []
    assert audited([fault("daemon SIGKILL", ("reg_a",), 10.0 - LEASE - 2.0, 1.0)])[0] == []
    # After the run it superseded began, and a lease later: too late to have caused it.
    assert audited([fault("daemon SIGKILL", ("reg_a",), 19.0 + LEASE + 1.0, 1.0)])[0] == []


def test_a_kill_on_the_site_of_the_run_that_counted_or_just_before_the_run_explains() -> None:
    assert audited([fault("daemon SIGKILL", ("reg_b",), 18.0, 1.0)])[1] == []
    assert audited([fault("daemon SIGKILL", ("reg_a",), 10.0 - LEASE + 1.0, 1.0)])[1] == []


def test_the_nearest_explaining_fault_is_named() -> None:
    explained, _ = audited([fault("daemon SIGKILL", ("reg_a",), 5.0, 1.0, number=1),
                            fault("site isolated, past the lease", ("reg_a",), 10.5, 9.0,
                                  number=2),
                            fault("daemon SIGKILL", ("reg_a",), 15.0, 1.0, number=3)])
    assert "fault #2 site isolated, past the lease reg_a at 10.5 s" in explained[0]


def test_a_creator_fault_explains_runs_anywhere_in_a_job_taken_over_only() -> None:
    doc = job_revoked_on_reg_a()
    audit = audit_run(LEDGER, {"j1": doc}, ["j1"])
    [extra] = extra_runs(audit, LEDGER, TIMES, {"j1": doc})
    cut_off = fault("creator cut off", ("global",), 2.0, 18.0)
    assert explaining_fault(extra, [cut_off], LEASE) is None  # never adopted
    doc["history"].insert(1, event("adopted", 0, 2, "reg_a", "automatic succession"))
    [extra] = extra_runs(audit, LEDGER, TIMES, {"j1": doc})
    assert extra.taken_over and extra.creators == {"global", "reg_a"}
    assert explaining_fault(extra, [cut_off], LEASE) is cut_off
    # Its branch lingers until the merge: a run long after the fault healed still counts.
    assert explaining_fault(extra, [fault("creator cut off", ("global",), -60.0, 18.0)],
                            LEASE) is not None
    assert explaining_fault(extra, [fault("creator cut off", ("global",), 40.0, 5.0)],
                            LEASE) is None  # but not one that began after it


def test_a_fault_never_healed_covers_the_rest_of_the_run() -> None:
    skew = fault("clock skew beyond margin", ("reg_a", "global"), 0.0, None)
    assert skew.seconds == float("inf") and "for" not in skew.describe(T0)
    assert audited([skew])[1] == []
    assert audited([fault("clock skew within margin", ("reg_a",), 0.0, None)])[0] == []


def test_spans_pair_each_start_with_its_end_by_fencing_token() -> None:
    assert spans(LEDGER, TIMES) == {
        ("j1", (0, 1, "reg_a")): Span("reg_a", T0 + 10.0, None),
        ("j1", (0, 2, "reg_b")): Span("reg_b", T0 + 19.0, T0 + 20.0)}


def test_an_unknown_kind_of_fault_explains_nothing() -> None:
    assert not makes_reruns_unavoidable(fault("cosmic ray", ("reg_a",), 10.0, 100.0), LEASE)
