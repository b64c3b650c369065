"""`show`'s history names a claim that another site's start overtook: not a second run."""

from __future__ import annotations

import json

from jobdist.model import Doc, event
from jobdist.render import event_name, lost_claims

AT = "2026-11-22T10:00:00.000000Z"


def ev(name: str, site: str, epoch: int, step: int = 0, detail: str | None = None) -> Doc:
    return event(name, step=step, site=site, at=AT, epoch=epoch, detail=detail)


def names(history: list[Doc]) -> list[str]:
    lost = lost_claims(history)
    return [str(event_name(entry, lost)) for entry in history]


def test_a_claim_overtaken_by_the_creators_direct_start_is_a_lost_claim() -> None:
    history = [ev("created", "global", 0), ev("started", "global", 1), ev("claimed", "reg_a", 0)]
    assert names(history) == ["created", "started", "claim lost"]


def test_a_claim_that_won_or_still_waits_stays_a_claim() -> None:
    won = [ev("claimed", "reg_a", 0), ev("claimed", "reg_b", 0),
           ev("won", "global", 1, detail="winner reg_a"), ev("started", "reg_a", 1)]
    assert names(won) == ["claimed", "claim lost", "won", "started"]
    # Released in epoch 2, claimed again: the new claim waits for a decision.
    again = [*won, ev("released", "global", 2), ev("claimed", "reg_b", 2)]
    assert names(again)[-1] == "claimed"
    assert json.dumps(again[-1], sort_keys=True) not in lost_claims(again)
