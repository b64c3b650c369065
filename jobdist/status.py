"""Site status documents: each site's room for work, published for the creators.

Every daemon publishes one small replicated document, `site-<name>`: how many of
its workers are free, whether it is draining, that it assigns. A creator that
cannot start an open step itself gives it to a site whose status shows room: the
`won` revision it writes after a claim, written without waiting for one, so a
remote step starts one replication hop after it is submitted instead of three
(docs/protocol.md, "Assignment by room"). Sites read their creators' status to
know a claim would mostly lose to such an assignment, and hold it back a moment.

A site's room is its free workers and its queue: as many wins as it has workers,
held until a worker frees (core.placement.queues), so that a busy site's next start costs no
hop. The knowledge is always a little stale, which costs time, never safety: a
site assigned a step it can neither start nor hold releases it as after any
claim, and the creator still alone picks winners. An unchanged status is published
again every REFRESH seconds (Publisher), so that others tell a silent site from a busy one.

Silence is what automatic creator succession acts on: no new status from a
creator for `creator_timeout`, measured on our own monotonic clock from when we
last heard one, never by comparing its `updated_at` with our clock (the two
clocks may disagree by any amount).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from .document_rules import validate_site_status
from .memo import remember
from .model import Doc, Leaf, Phase, Reason, StepKey, step_phase

PREFIX = "site-"
MIN_INTERVAL = 1.0  # seconds between two publications of a changed room
# A changed room is published once it has held this long (Publisher.due): a worker freed
# and taken again at once is no news for creators.
SETTLE = 0.25
REFRESH = 30.0  # an unchanged status is published again this often (Timings.status_refresh)
STALE_AFTER = 3 * REFRESH  # a status not renewed for this long (our clock) is ignored
ASSIGNED_FOR = 3.0  # seconds an assignment counts against a room its site has not re-published
MAX_WON = 10_000  # steps won at other sites and not started that we keep count of
# How long a site is queued nothing after it gave a win back unstarted, by the release's
# reason code: it queues none, or none long enough (long steps run there); its queue was
# full (creators' counts lag one another: a moment). A release without a code (written
# before events had one) backs nothing off: the hint is for seconds, and going without it
# costs a win given back again, never a wrong run.
QUEUE_BACKOFF = {Reason.NO_WORKER: 30.0, Reason.NO_WORKER_IN_TIME: 30.0,
                 Reason.QUEUE_FULL: 3.0}


def status_id(site: str) -> str:
    return PREFIX + site


def is_status_id(doc_id: str) -> bool:
    return doc_id.startswith(PREFIX)


@dataclass(frozen=True)
class SiteStatus:
    site: str
    workers: int
    free_workers: int
    draining: bool
    assigns: bool  # it assigns its open steps to sites with room
    restricted: bool  # it runs only an allow-list of commands: never assigned to
    updated_at: str

    def as_doc(self) -> Doc:
        return {"_id": status_id(self.site), "type": "site", **asdict(self)}

    @property
    def room(self) -> int:
        return 0 if self.draining or self.restricted else self.free_workers

    @property
    def queue(self) -> int:
        """Wins it may hold beyond its free workers, to start as they free (placement.queues)."""
        return 0 if self.draining or self.restricted else self.workers

    @classmethod
    def parse(cls, doc: Any) -> SiteStatus | None:
        """The status a document holds, or None when it is not a well-formed one."""
        if not isinstance(doc, dict) or doc.get("type") != "site" or validate_site_status(doc):
            return None
        return cls(**{name: doc[name] for name in cls.__dataclass_fields__})


class Board:
    """What this site knows of the other sites' status, timed by its own clock."""

    def __init__(self, site: str, started: float = 0.0) -> None:
        self.site = site
        self.statuses: dict[str, tuple[SiteStatus, float]] = {}  # site -> (status, heard at)
        self.assigned: dict[StepKey, tuple[str, float]] = {}  # step -> (site, when we assigned it)
        # site -> (its last `updated_at`, when we heard that new status): silence counts
        # from there, or from `started` for a site we never heard.
        self.news: dict[str, tuple[str, float]] = {}
        self.started = started
        # Jobs whose step a site other than us won and has not started: job -> (step, site).
        self.won: dict[str, tuple[StepKey, str]] = {}
        self.no_queue: dict[str, float] = {}  # site -> until when it is queued nothing
        self.fed: dict[str, float] = {}  # creator -> when a step it gave us first reached us
        self.given: dict[tuple[StepKey, int], float] = {}  # our wins seen (step, epoch): when

    def hear(self, doc: Any, now: float) -> bool:
        """Take in a status document; True when that site has more room than we knew."""
        status = SiteStatus.parse(doc)
        if status is None or status.site == self.site:
            return False
        before = self.statuses.get(status.site)
        self.statuses[status.site] = (status, now)
        if self.news.get(status.site, ("", 0.0))[0] != status.updated_at:
            self.news[status.site] = (status.updated_at, now)  # a re-delivery is no news
        # Its new room already counts what it started of ours; what is still on the
        # way shows in its next status.
        self.assigned = {key: (site, at) for key, (site, at) in self.assigned.items()
                         if site != status.site or now - at < MIN_INTERVAL}
        return before is None or status.room > before[0].room

    def forget(self, site: str) -> None:
        """Until `site` publishes again: we revoked its lease, so it may be dead or cut off,
        and its last status (fresh for up to STALE_AFTER) would have us assign to it again."""
        self.statuses.pop(site, None)

    def silent(self, sites: Iterable[str], now: float, timeout: float) -> frozenset[str]:
        """The sites (never us) from which no new status reached us for `timeout` seconds."""
        return frozenset(site for site in sites if site != self.site
                         and now - self.news.get(site, ("", self.started))[1] >= timeout)

    def restart_silence(self, now: float) -> None:
        """Our own CouchDB did not answer: what we did not hear meanwhile proves nothing."""
        self.started = now
        self.news = {site: (updated_at, now) for site, (updated_at, _) in self.news.items()}

    def note_assigned(self, key: StepKey, site: str, now: float) -> None:
        """We give `site` a step (before the write: the next decision of the batch counts
        it): unstarted until the job shows otherwise (saw_job)."""
        self.assigned[key] = (site, now)
        self.won[key[0]] = (key, site)

    def room(self, now: float) -> dict[str, int]:
        return self.rooms(now)[0]

    def rooms(self, now: float) -> tuple[dict[str, int], dict[str, int]]:
        """Steps each site with a fresh status may still be given, and how many of those
        its free workers would start at once. Its room: its free workers less what we
        gave it that started since (what its status may not count yet), and its queue,
        less the wins (any creator's) it has not started."""
        # An effect, kept in this query the planners ask: forgetting what expired is
        # idempotent, and saw_job must not count it either.
        self.assigned = {key: (site, at) for key, (site, at) in self.assigned.items()
                         if now - at < ASSIGNED_FOR}
        unstarted: dict[str, set[StepKey]] = {}
        for key, winner in self.won.values():
            unstarted.setdefault(winner, set()).add(key)
        started: dict[str, int] = {}
        for key, (site, _) in self.assigned.items():
            if key not in unstarted.get(site, ()):
                started[site] = started.get(site, 0) + 1
        room, idle = {}, {}
        for site, (status, heard) in self.statuses.items():
            if now - heard >= STALE_AFTER:
                continue
            # A start beyond its free workers took a worker freed since: not a free one.
            idle[site] = max(0, status.room - started.get(site, 0))
            queue = 0 if now < self.no_queue.get(site, 0.0) else status.queue
            room[site] = idle[site] + queue - len(unstarted.get(site, ()))
        return room, idle

    def free_workers(self, now: float) -> dict[str, int]:
        """Workers free at each site with a fresh status, as far as we know: those its
        room counts, and at a restricted site (never given steps, so its room is 0) those
        its status counts."""
        _, idle = self.rooms(now)
        for site, (status, heard) in self.statuses.items():
            if status.restricted and not status.draining and now - heard < STALE_AFTER:
                idle[site] = status.free_workers
        return idle

    def saw_job(self, doc_id: str, doc: Leaf | None, now: float) -> bool:
        """A job as we last saw it (None: gone). A step another site won and has not
        started waits in that site's queue, whoever created it; a win a site gave back
        unstarted says to queue it nothing for a while (QUEUE_BACKOFF); a step we gave a
        site that has ended frees its worker there. True when a site has room again."""
        win = _unstarted_win(doc_id, doc)
        if win is not None and win[1] == self.site:
            self._note_given(doc, win, now)
        freed = False
        for key in [key for key in self.assigned if key[0] == doc_id and _ended(doc, key[1])]:
            # Its worker is free again, whatever the site's last status says, unless the
            # site chained the job's next step onto it.
            site, at = self.assigned.pop(key)
            chained = _held_by(doc_id, doc, site)
            if chained is not None:
                self.assigned[chained] = (site, at)
            freed = freed or chained is None
        before = self.won.get(doc_id)
        elsewhere = None if win is None or win[1] == self.site else (win[0], win[1])
        remember(self.won, doc_id, elsewhere, MAX_WON)
        if elsewhere is None and doc is not None and before is not None:  # the release, once
            gave_back = _gave_back_unstarted(doc)
            if gave_back is not None:
                site, reason = gave_back
                self.no_queue[site] = max(self.no_queue.get(site, 0.0),
                                          now + QUEUE_BACKOFF[reason])
        return freed or (before is not None and elsewhere is None)

    def _note_given(self, doc: Leaf | None, win: tuple[StepKey, str, Leaf], now: float) -> None:
        """A win of ours, not started, in another creator's job, seen for the first
        time: that creator is live and feeding us. Seeing the same win again (a queued
        win read, a feed's late copy) is no news of the creator."""
        assert doc is not None  # (the win is read from it)
        key, _, step = win
        creator, epoch = doc.get("creator"), step.get("epoch")
        if not isinstance(creator, str) or creator == self.site or not isinstance(epoch, int) \
                or (key, epoch) in self.given:
            return
        self.fed[creator] = now
        remember(self.given, (key, epoch), now, MAX_WON)

    def feeding(self, now: float, within: float) -> frozenset[str]:
        """Creators that gave us a step (a win we hold unstarted) within `within` seconds."""
        return frozenset(site for site, at in self.fed.items() if now - at < within)

    def sites_live(self, now: float) -> int:
        """Sites taking work as far as we know: us, and those with a fresh status."""
        return 1 + sum(now - heard < STALE_AFTER for _, heard in self.statuses.values())

    def assigning(self, now: float) -> frozenset[str]:
        """Creators whose fresh status says they assign open steps."""
        return frozenset(site for site, (status, heard) in self.statuses.items()
                         if status.assigns and now - heard < STALE_AFTER)


def _unstarted_win(doc_id: str, doc: Leaf | None) -> tuple[StepKey, str, Leaf] | None:
    """(step, winner, the step itself) when a site won the job's current step and has
    not started it."""
    current = _current_step(doc) if isinstance(doc, dict) and doc.get("type") == "job" else None
    if current is None:
        return None
    index, step = current
    winner = step.get("winner")
    if not isinstance(winner, str) or step_phase(step) != Phase.WON:
        return None
    return (doc_id, index), winner, step


def _current_step(doc: Leaf | None) -> tuple[int, Leaf] | None:
    """(index, step) of a live job's current step; None for an ended, deleted or
    malformed job (the document comes straight from the feed: nothing is assumed)."""
    if not isinstance(doc, dict) or doc.get("job_status") is not None or doc.get("_deleted"):
        return None
    index, steps = doc.get("step"), doc.get("job")
    if not isinstance(index, int) or not isinstance(steps, list) or \
            not 0 <= index < len(steps) or not isinstance(steps[index], dict):
        return None
    return index, steps[index]


def _ended(doc: Leaf | None, index: int) -> bool:
    """Has the job's step `index` ended (or the job itself, or been deleted)? An
    unreadable job (None) says nothing."""
    if not isinstance(doc, dict):
        return False
    if doc.get("_deleted") or doc.get("job_status") is not None:
        return True
    step = doc.get("step")
    return isinstance(step, int) and step > index


def _held_by(doc_id: str, doc: Leaf | None, site: str) -> StepKey | None:
    """The job's current step, if `site` holds it (won or running)."""
    current = _current_step(doc)
    if current is None:
        return None
    index, step = current
    held = step.get("winner") == site and Phase.WON <= step_phase(step) < Phase.DONE
    return (doc_id, index) if held else None


def _gave_back_unstarted(doc: Leaf) -> tuple[str, Reason] | None:
    """(site, reason) when the job's last event is a site's release of a win it could
    neither start nor queue."""
    history = doc.get("history")
    last = history[-1] if isinstance(history, list) and history else None
    if not isinstance(last, dict) or last.get("event") != "released":
        return None
    site, reason = last.get("site"), last.get("reason")
    if isinstance(site, str) and isinstance(reason, str) and reason in QUEUE_BACKOFF:
        return site, Reason(reason)
    return None


class Publisher:
    """When to publish this site's own status: a changed room soon, the same one rarely.

    While no open step waits that the site may run, a changed room waits until it has
    held for SETTLE. Rooms change at the moments a step ends, which are the moments
    its site writes the step's end and starts the next: a status written then held
    those decisions up (the manager's write, then the replication batch ahead of
    theirs), to tell creators of room they had no open step for. While open steps
    wait (`urgent`), a creator may give us one: the room is news at once."""

    def __init__(self, refresh: float = REFRESH) -> None:
        self.refresh = refresh  # publish an unchanged status again this often
        self.last: SiteStatus | None = None
        self.last_at = float("-inf")
        self.rev: str | None = None  # of our status document, once known
        self.changed_at: float | None = None  # since when the room differs from `last`
        self.retry_at = float("-inf")  # after a publication that failed

    def due(self, status: SiteStatus, now: float, urgent: bool = True) -> bool:
        return self.due_at(status, now, urgent) <= now

    def due_at(self, status: SiteStatus, now: float, urgent: bool = True) -> float:
        """When `status` is to be published (the manager wakes for it). Each call notes
        since when the room differs from the one published (`changed_at`)."""
        return max(self._wanted_at(status, now, urgent), self.retry_at)

    def _wanted_at(self, status: SiteStatus, now: float, urgent: bool) -> float:
        if self.last is None:
            return now
        refresh_at = self.last_at + self.refresh
        if (status.room, status.workers) == (self.last.room, self.last.workers):
            self.changed_at = None
            return refresh_at
        if self.changed_at is None:
            self.changed_at = now
        settled_at = self.changed_at + (0.0 if urgent else SETTLE)
        return min(refresh_at, max(self.last_at + MIN_INTERVAL, settled_at))

    def published(self, status: SiteStatus, rev: str, now: float) -> None:
        self.last, self.last_at, self.rev = status, now, rev
        self.changed_at = None

    def failed(self, now: float) -> None:
        """Not published (the server's trouble): try again a MIN_INTERVAL later, not in
        every round of the manager, which wakes for a publication due."""
        self.retry_at = now + MIN_INTERVAL
