"""Timings: every interval derived from the lease and the creator timeout, each below what
it guards, moved by the setting it comes from, and equal to what the core derives."""

from __future__ import annotations

import pytest

from jobdist import core
from jobdist.clock import later
from jobdist.config import (
    CouchSettings,
    DaemonSettings,
    SiteConfig,
    SuccessionSettings,
    TuningSettings,
)
from jobdist.core.placement import queued_too_long
from jobdist.core.starts import fresh_win
from jobdist.model import new_job, new_step
from jobdist.status import MIN_INTERVAL, REFRESH
from jobdist.timings import Timings

NOW = "2026-01-01T00:00:00.000000Z"


def timings(lease: float = 60.0, creator_timeout: float = 120.0) -> Timings:
    """The timings of a site with this lease and creator timeout (the rest: defaults)."""
    daemon = DaemonSettings(lease=lease)
    succession = SuccessionSettings(creator_timeout=creator_timeout)
    return SiteConfig("solo", CouchSettings("http://127.0.0.1:1"), daemon=daemon,
                      succession=succession).timings


@pytest.mark.parametrize("lease", [4.0, 6.0, 60.0, 600.0])
@pytest.mark.parametrize("creator_timeout", [4.0, 30.0, 120.0, 3600.0])
def test_every_derived_interval_is_below_what_it_guards(lease: float,
                                                         creator_timeout: float) -> None:
    times = timings(lease, creator_timeout)
    times.check()
    # The lease outlives lost renewals, and a skipped renewal the next heartbeat.
    assert 0 < times.heartbeat <= lease / 2 and times.renew_below >= times.heartbeat
    assert times.lease_scan_interval < times.heartbeat
    # A held win and a held-back start reach the creator with time to spare.
    assert times.queue_hold_max < lease and times.start_delay <= times.start_write_delay_max
    assert times.queue_hold_max + times.start_write_delay_max < lease
    # A deferred start's run stops before a revocation or a successor's adoption.
    assert times.defer_limit < min(lease, creator_timeout)
    # Four statuses (at least) within a creator timeout, as often as publishing allows.
    assert 4 * times.status_refresh <= creator_timeout or times.status_refresh == MIN_INTERVAL
    assert MIN_INTERVAL <= times.status_refresh <= REFRESH
    assert times.succession_scan_interval < creator_timeout


def test_a_changed_lease_moves_what_derives_from_it() -> None:
    short, long = timings(lease=8.0), timings(lease=80.0)
    for name in ("heartbeat", "renew_below", "lease_scan_interval", "queue_hold_max",
                 "start_write_delay_max", "defer_limit"):
        assert getattr(long, name) == 10 * getattr(short, name), name
    assert (short.start_delay, long.start_delay) == (1.0, 1.0)  # the delay set, 1 s
    assert timings(lease=2.0).start_delay == 0.5  # a quarter of the lease at most


def test_a_changed_creator_timeout_moves_what_derives_from_it() -> None:
    short, long = timings(creator_timeout=8.0), timings(creator_timeout=80.0)
    assert (short.status_refresh, long.status_refresh) == (2.0, 20.0)
    assert (short.succession_scan_interval, long.succession_scan_interval) == (2.0, 20.0)
    assert (short.defer_limit, long.defer_limit) == (4.0, 30.0)  # half the shorter bound
    # Published at most every REFRESH, and never more than once a MIN_INTERVAL.
    assert timings(creator_timeout=1200.0).status_refresh == REFRESH
    assert timings(creator_timeout=2.0).status_refresh == MIN_INTERVAL


def test_a_tuned_heartbeat_replaces_the_derived_one() -> None:
    config = SiteConfig("solo", CouchSettings("http://127.0.0.1:1"),
                        tuning=TuningSettings(heartbeat=5.0))
    assert (config.timings.heartbeat, config.timings.renew_below) == (5.0, 55.0)
    assert timings().heartbeat == 15.0


@pytest.mark.parametrize("lease", [6.0, 60.0])
def test_the_queue_hold_is_the_half_lease_the_core_holds_wins_for(lease: float) -> None:
    """The manager gives a queued win back at queue_hold_max; the core (core.queued_too_long)
    counts the same half of the lease from Context.lease."""
    hold = timings(lease).queue_hold_max
    doc = new_job("global", [new_step("true")])
    key = (doc["_id"], 0)
    ctx = core.Context("solo", NOW, lease=lease)
    assert queued_too_long(doc, key, core.PoolView(queued={key: hold}), ctx)
    assert not queued_too_long(doc, key, core.PoolView(queued={key: hold * 0.99}), ctx)


@pytest.mark.parametrize("lease", [6.0, 60.0])
def test_a_start_held_back_its_longest_still_leaves_a_quarter_of_the_lease(
        lease: float) -> None:
    """The core launches a win ahead only with half its start-by lease left (fresh_win):
    a start held back start_write_delay_max then still has a quarter of the lease left."""
    ctx = core.Context("solo", NOW, lease=lease)
    assert fresh_win({"lease_until": later(NOW, lease / 2)}, ctx)
    assert not fresh_win({"lease_until": later(NOW, lease / 2 - 0.01)}, ctx)
    assert lease / 2 - timings(lease).start_write_delay_max == lease / 4


def test_a_negative_skew_margin_is_refused_it_would_revoke_a_live_lease() -> None:
    """The creator revokes a lease once it ran out `clock_skew_margin` ago and stayed
    silent `lease + clock_skew_margin`: below 0, a lease renewed on time, clocks in step,
    would be revoked while its holder still runs within it."""
    lease, margin = 60.0, -50.0
    deadline = later(NOW, 30.0)  # renewed 30 s ago, 30 s left by every clock
    ctx = core.Context("global", NOW, lease=lease, skew_margin=margin,
                       lease_silence={deadline: 30.0})
    assert ctx.lease_expired({"lease_until": deadline})  # what the core would do
    daemon = DaemonSettings(lease=lease, clock_skew_margin=margin)
    with pytest.raises(ValueError, match=r"daemon.clock_skew_margin \(-50.0\) must be at least 0"):
        SiteConfig("solo", CouchSettings("http://127.0.0.1:1"), daemon=daemon).timings.check()
    timings_at_zero = SiteConfig("solo", CouchSettings("http://127.0.0.1:1"),
                                 daemon=DaemonSettings(clock_skew_margin=0.0)).timings
    timings_at_zero.check()  # clocks known to agree: no margin is a valid choice
