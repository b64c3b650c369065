"""The strict fault audit (jobdist.lab.faultlog): each duplicate run matched to the
injected fault that made it unavoidable, by site, time and how long the fault
lasted. Pure: ledgers, fault logs and final documents written by hand."""

from __future__ import annotations

from jobdist.lab.audit import LedgerRow, audit_run
from jobdist.lab.faultlog import (
    REPLICATION_RETRY_SECONDS,
    Fault,
    Span,
    audit_faults,
    explaining_fault,
    extra_runs,
    makes_reruns_unavoidable,
    replication_stopped,
    settled,
    spans,
)
from jobdist.model import Doc

LEASE = 6.0
T0 = 1_000.0  # the run's origin, Unix time


def event(name: str, step: int, epoch: int, site: str, detail: str | None = None) -> Doc:
    return {"event": name, "step": step, "epoch": epoch, "site": site, "detail": detail,
            "at": "2026-11-23T00:00:00.000000Z"}


def one_step_job(job_id: str, epoch: int, winner: str, history: list[Doc]) -> Doc:
    """A job of one step, created at global, that succeeded: its run in `epoch` on
    `winner` counted."""
    return {"_id": job_id, "creator": "global", "job_status": "success", "history": history,
            "job": [{"step_status": "finished", "epoch": epoch, "winner": winner,
                     "target": "any"}]}


def job_revoked_on_reg_a() -> Doc:
    """Run on reg_a in epoch 1, whose lease the creator revoked; run again on reg_b in
    epoch 2, which counted."""
    return one_step_job("j1", 2, "reg_b", [
        event("started", 0, 1, "reg_a"),
        event("released", 0, 2, "global", "lease of reg_a expired at ..."),
        event("started", 0, 2, "reg_b"), event("finished", 0, 2, "reg_b")])


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
    # A cut stops replication: with the replicator's back-off, under half a lease is safe.
    assert not makes_reruns_unavoidable(fault("site isolated, within the lease", ("reg_a",),
                                              0.0, LEASE / 2 - 0.5), LEASE)
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


def test_the_creator_cut_off_past_the_lease_explains_runs_on_every_site() -> None:
    # j1's creator is global: cut off, it hears no renewal from reg_a and revokes it.
    assert audited([fault("site isolated, past the lease", ("global",), 11.0, 9.0)])[1] == []
    # A pause of its daemon is not that: back, it reads the renewals that came meanwhile.
    assert audited([fault("daemon SIGSTOP, past the lease", ("global",), 11.0, 9.0)])[0] == []


def test_a_fault_on_the_site_that_ran_the_step_before_explains_a_run_on_its_finish() -> None:
    ledger: list[LedgerRow] = [("start", "j1", 0, "global", 1), ("end", "j1", 0, "global", 1),
                               *[(kind, "j1", 1, site, epoch)
                                 for kind, _, _, site, epoch in LEDGER]]
    times = [T0 + 8.0, T0 + 9.5, *TIMES]
    doc = job_revoked_on_reg_a()
    doc["job"] = [{"step_status": "finished", "epoch": 1, "winner": "global", "target": "any"},
                  {**doc["job"][0]}]
    for entry in doc["history"]:
        entry["step"] = 1
    audit = audit_run(ledger, {"j1": doc}, ["j1"])
    [extra] = extra_runs(audit, ledger, times, {"j1": doc})
    assert {span.site for span in extra.before_spans} == {"global"}
    kill = fault("daemon SIGKILL", ("global",), 9.0, 1.0)
    assert explaining_fault(extra, [kill], LEASE) is kill


def test_a_run_outranked_by_a_revoked_run_that_finished_the_job_is_explained() -> None:
    """The creator revoked reg_b's lease and ran the step again, while reg_b's run went
    on and finished the job: the leaf where the job succeeded outranks the release."""
    doc = one_step_job("j2", 1, "reg_b", [
        event("started", 0, 1, "reg_b"),
        event("released", 0, 2, "global", "lease of reg_b expired at ..."),
        event("finished", 0, 1, "reg_b"), event("started", 0, 3, "global")])
    ledger: list[LedgerRow] = [("start", "j2", 0, "reg_b", 1), ("end", "j2", 0, "reg_b", 1),
                               ("start", "j2", 0, "global", 3), ("end", "j2", 0, "global", 3)]
    audit = audit_run(ledger, {"j2": doc}, ["j2"])
    assert audit.problems == []
    [duplicate] = audit.duplicates
    assert duplicate.startswith("j2 step 0 epoch 3 on global: step 0 epoch 1 on reg_b finished "
                                "though revoked (released by global: lease of reg_b expired")
    assert audit.extra_runs == [("j2", (0, 3, "global"))]
    # Had the job failed, the release would have won: nothing explains the run then.
    doc["job_status"] = "failed"
    doc["job"][0]["step_status"] = "failed"
    assert "history says nothing" in audit_run(ledger, {"j2": doc}, ["j2"], None).problems[0]


def test_a_run_chained_on_a_run_outranked_by_success_is_explained_too() -> None:
    """The cut-off creator ran step 0 again and chained step 1 on its finish, in one
    revision, while the other side's revoked run of step 0 went on and finished the
    job: the whole branch lost, so step 1's run is explained by step 0's."""
    doc = one_step_job("j3", 1, "reg_b", [
        event("started", 0, 1, "reg_b"), event("finished", 0, 1, "reg_b"),
        event("started", 1, 1, "reg_b"), event("finished", 1, 1, "reg_b"),
        event("released", 0, 2, "global", "lease of reg_b expired at ..."),
        event("started", 0, 3, "global"), event("finished", 0, 3, "global"),
        event("started", 1, 1, "global"), event("finished", 1, 1, "global")])
    doc["job"].append({"step_status": "finished", "epoch": 1, "winner": "reg_b",
                       "target": "any"})
    ledger: list[LedgerRow] = [(kind, "j3", step, site, epoch)
                               for step, epoch, site in ((0, 1, "reg_b"), (1, 1, "reg_b"),
                                                         (0, 3, "global"), (1, 1, "global"))
                               for kind in ("start", "end")]
    audit = audit_run(ledger, {"j3": doc}, ["j3"])
    assert audit.problems == []
    assert audit.extra_runs == [("j3", (0, 3, "global")), ("j3", (1, 1, "global"))]
    assert audit.duplicates[1].startswith(
        "j3 step 1 epoch 1 on global: chained on step 0 epoch 3, step 0 epoch 1 on reg_b "
        "finished though revoked")


def test_an_outage_of_replication_lasts_until_the_replicator_tries_again() -> None:
    # Healed 8 s before the run began: past the lease and the replicator's next try.
    outage = fault("CouchDB SIGKILL", ("reg_a",), 10.0 - LEASE - 8.0 - 9.0, 9.0)
    assert settled(outage) == outage.end + REPLICATION_RETRY_SECONDS
    assert audited([outage])[1] != []
    # Healed just before: the replicator may not have tried again yet.
    recent = fault("CouchDB SIGKILL", ("reg_a",), 10.0 - LEASE - 0.5 - 9.0, 9.0)
    assert audited([recent])[1] == []
    # A daemon's pause stops no replication: its effects end when it is resumed.
    assert audited([fault("daemon SIGSTOP, past the lease", ("reg_a",),
                          10.0 - LEASE - 8.0 - 9.0, 9.0)])[0] == []


def test_a_couchdb_outage_under_a_lease_explains_no_rerun() -> None:
    # Down 3.5 s of a 6 s lease: the peers' replicators try again within a second.
    outage = fault("CouchDB SIGKILL", ("reg_a",), 11.0, 3.5, number=9)
    assert replication_stopped(outage) == 3.5 + REPLICATION_RETRY_SECONDS
    assert not makes_reruns_unavoidable(outage, LEASE)
    assert audited([outage])[1] != []
    # Down past the lease, less the retry: the explanation says for how long.
    longer = fault("CouchDB SIGKILL", ("reg_a",), 11.0, 5.5, number=9)
    assert makes_reruns_unavoidable(longer, LEASE)
    explained, _ = audited([longer])
    assert explained[0].endswith("explained by fault #9 CouchDB SIGKILL reg_a at 11.0 s for "
                                 "5.5 s (replication stopped up to 6.5 s)")
    assert not makes_reruns_unavoidable(fault("CouchDB SIGKILL", ("reg_a",), 11.0, 2.9), LEASE)
