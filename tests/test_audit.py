"""The ledger audit's reading of a job's history (jobdist/lab/audit.py)."""

from __future__ import annotations

from jobdist.lab.audit import why_superseded
from jobdist.model import Doc


def event(name: str, epoch: int, site: str, at: int, detail: str = "") -> Doc:
    return {"event": name, "step": 1, "epoch": epoch, "site": site,
            "at": f"2026-11-29T00:00:{at:02d}Z", "detail": detail}


def test_a_release_that_went_above_another_branchs_epochs_ends_the_run_it_released() -> None:
    """A new epoch goes above every one the step's history shows: reg_a's run in epoch 1,
    revoked once reg_b's branch (epoch 2) was merged in, is released to epoch 3."""
    history = [event("started", 1, "reg_a", 1), event("started", 2, "reg_b", 2),
               event("released", 3, "global", 3, "lease of reg_a expired at ...")]
    assert why_superseded(history, (1, 1, "reg_a")) == \
        "released by global: lease of reg_a expired at ..."


def test_a_release_ends_the_sites_latest_run_not_an_earlier_one() -> None:
    history = [event("started", 1, "reg_a", 1), event("started", 2, "reg_a", 2),
               event("released", 3, "global", 3, "lease of reg_a expired at ...")]
    assert why_superseded(history, (1, 2, "reg_a")) is not None
    assert why_superseded(history, (1, 1, "reg_a")) is None
