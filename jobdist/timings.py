"""The daemon's timings: the settings they come from, and every interval derived from them.

An operator sets the lease and the clock skew margin (`[daemon]`) and the creator
timeout (`[succession]`); `[tuning]` holds the internal knobs (the heartbeat, the
booking timeout, the start write delay, the keep-alive), whose defaults are what we
measured. Every interval the daemon derives from them is a property here, with the
reason the relation holds, and `check` refuses settings that would break one: a
relation between two timings is written once, here (`SiteConfig.timings` builds it).

The decision core gets the settings through `core.Context` and derives one relation
itself: half the start-by lease (`core.fresh_win`, `core.queued_too_long`), which
`queue_hold_max` states for the manager too; tests/test_timings.py holds the two equal.
A lease is revoked only once silent for `lease + clock_skew_margin`
(`core.Context.lease_expired`): every bound below that keeps a start, a release or a
renewal ahead of a revocation is a share of the lease for that reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from .status import MIN_INTERVAL, REFRESH

# A creator must be able to publish several statuses within a creator timeout (see
# status_refresh), and a live site publishes at most once a MIN_INTERVAL.
STATUSES_PER_CREATOR_TIMEOUT = 4


@dataclass(frozen=True)
class Timings:
    """A site's timings in seconds (see the module docstring)."""

    lease: float  # a win's start-by time, and a running step's promise unless renewed
    clock_skew_margin: float  # the creator waits this much past a lease: clocks differ
    creator_timeout: float  # a creator silent this long (our clock) is succeeded
    tuned_heartbeat: float | None  # [tuning] heartbeat; None: derived (heartbeat)
    booking_timeout: float  # a worker booked for a claim the creator has not decided
    start_write_delay: float  # as set; start_delay is what applies
    keepalive_period: float  # seconds between keep-alive passes
    keepalive_stale_after: float  # an open job unchanged this long is re-saved

    @property
    def heartbeat(self) -> float:
        """How often a site renews the leases of its steps: unless tuned, a quarter of the
        lease, so a lease outlives three lost renewals in a row."""
        return self.lease / 4 if self.tuned_heartbeat is None else self.tuned_heartbeat

    @property
    def renew_below(self) -> float:
        """A heartbeat rewrites only a lease with less than this left: one a start or a
        progress write renewed within the last heartbeat needs no write, and still lasts
        past the next heartbeat (the heartbeat is at most half the lease: check)."""
        return self.lease - self.heartbeat

    @property
    def lease_scan_interval(self) -> float:
        """How often a creator looks for leases past due: twice a heartbeat, so a lease
        whose renewals stopped is revoked within half a heartbeat of falling due."""
        return self.heartbeat / 2

    @property
    def queue_hold_max(self) -> float:
        """A win held for want of a worker is started or given back at half its start-by
        lease: the creator revokes only after the whole lease and the skew margin of
        silence, so the start or the release reaches it first (core.queued_too_long)."""
        return self.lease / 2

    @property
    def start_write_delay_max(self) -> float:
        """A start launched ahead is held back a quarter of the lease at most: a win is
        launched ahead only with half its start-by lease left (core.fresh_win), so its
        start is written with a quarter of the lease to spare before a revocation."""
        return self.lease / 4

    @property
    def start_delay(self) -> float:
        """start_write_delay as it applies: start_write_delay_max at most."""
        return min(self.start_write_delay, self.start_write_delay_max)

    @property
    def defer_limit(self) -> float:
        """A deferred start the server does not take lets its run go on this long, then
        the run is stopped: within the lease (the creator may revoke the win) and the
        creator timeout (a successor may adopt the job and start the step in our epoch)."""
        return min(self.lease, self.creator_timeout) / 2

    @property
    def status_refresh(self) -> float:
        """How often an unchanged status is published again: several times a creator
        timeout, so a live creator whose one status is late is not taken for silent;
        never more than once a MIN_INTERVAL, nor less than once a REFRESH."""
        return max(MIN_INTERVAL, min(REFRESH, self.creator_timeout / STATUSES_PER_CREATOR_TIMEOUT))

    @property
    def succession_scan_interval(self) -> float:
        """How often a site looks for jobs of silent creators of its lines: a creator's
        jobs are taken over within a quarter of the timeout past its silence."""
        return self.creator_timeout / 4

    def check(self) -> None:
        """ValueError naming the settings when one of the relations cannot hold."""
        if not self.lease > 0:
            raise ValueError(f"daemon.lease ({self.lease}) must be above 0")
        if not self.clock_skew_margin >= 0:
            raise ValueError(f"daemon.clock_skew_margin ({self.clock_skew_margin}) must be at "
                             "least 0: the creator revokes a lease only that long past it")
        if not 0 < self.heartbeat <= self.lease / 2:
            raise ValueError(f"tuning.heartbeat ({self.heartbeat}) must be above 0 and at "
                             f"most half of daemon.lease ({self.lease}), so one lost "
                             "heartbeat is not fatal")
        if not self.start_write_delay >= 0:
            raise ValueError(f"tuning.start_write_delay ({self.start_write_delay}) must be "
                             "at least 0")
        shortest = STATUSES_PER_CREATOR_TIMEOUT * MIN_INTERVAL
        if not self.creator_timeout >= shortest:
            raise ValueError(f"succession.creator_timeout ({self.creator_timeout}) must be "
                             f"at least {shortest:g} s: {STATUSES_PER_CREATOR_TIMEOUT} "
                             "renewals of a site's status")
