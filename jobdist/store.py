"""Where the work manager reads and writes jobs: the JobStore seam.

The manager needs few things of its site's database: the live leaves of many
jobs at once, one bulk write, a few questions (which open steps may this site
take, whose leases are due, which live jobs does this site have a part in, which
jobs wait, and on what) and a place for its feed checkpoint. `CouchStore` answers
them from the site's CouchDB through the `jobdist` design document's views;
`jobdist/lab/sim.py` from a simulated replica, so the real manager is tested
without servers (tests/test_manager.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from . import keepalive, status
from .couch import Conflict, Database, Rejected, Saved
from .couch_views import iter_view
from .design import DDOC
from .model import Doc, Leaf

Written = Saved | Conflict | Rejected


@dataclass(frozen=True)
class Open:
    """An open step a site may claim: its job, and the order sites take them in."""

    job_id: str
    rank: int  # core.claim_rank: lower goes first
    created_at: str


class JobStore(Protocol):
    @property
    def url(self) -> str:
        """Where the store lives, without credentials (steps carry it to find orphans)."""
        ...

    def read(self, ids: Iterable[str]) -> dict[str, list[Doc]]:
        """Every id's live leaf revisions ([] when it has none); raises CouchError."""
        ...

    def write(self, docs: Sequence[Leaf]) -> list[Written]:
        """Write revisions (each on its `_rev`); one result per document, in order."""
        ...

    def claimable(self, target: str, limit: int) -> list[Open]:
        """Open steps whose target names `target` ("any" included), best first."""
        ...

    def leases_due(self, creator: str, cutoff: str) -> list[str]:
        """Jobs created by `creator` whose current lease ends at or before `cutoff`."""
        ...

    def involving(self, site: str) -> Iterator[str]:
        """Live jobs whose current step has `site` as creator, claimer or winner."""
        ...

    def open_created(self, creator: str, limit: int) -> list[str]:
        """Live jobs `creator` created whose current step is open: the `limit` least
        recently touched, in line order (core.claim_rank)."""
        ...

    def statuses(self) -> list[Doc]:
        """Every site's status document (jobdist.status)."""
        ...

    def waiting(self, creator: str) -> list[str]:
        """Live jobs `creator` created that wait (model.is_waiting)."""
        ...

    def waiting_on(self, ids: Sequence[str]) -> list[tuple[str, str]]:
        """(waiting job, its creator) for each live waiting job that names one of `ids`."""
        ...

    def save_checkpoint(self, site: str, seq: object) -> None:
        """Note where `site`'s changes feed stopped (an opaque sequence): the daemon's
        next start resumes there (CouchStore.load_checkpoint)."""
        ...


# The periodic scans read a view's index as it stands and let the server bring it up
# to date afterwards: they are a safety net for what the feed did not bring, acted on
# only after a fresh read, and a scan that came just after a burst of new jobs
# otherwise waited for the whole burst to be indexed (2 s for 500 jobs on a loaded
# pouchdb-server), the manager with it.
SCAN_INDEX = "lazy"
CHECKPOINT = "jobdist-checkpoint"  # a `_local/` document: a restart resumes the feed there


class CouchStore:
    """A JobStore on a site's CouchDB database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @property
    def url(self) -> str:
        return self.db.url

    def read(self, ids: Iterable[str]) -> dict[str, list[Doc]]:
        return self.db.leaves_many(ids)

    def write(self, docs: Sequence[Leaf]) -> list[Written]:
        return self.db.bulk_docs(list(docs))

    def claimable(self, target: str, limit: int) -> list[Open]:
        rows = self.db.view(DDOC, "claimable", startkey=[target], endkey=[target, {}],
                            limit=limit, update=SCAN_INDEX)
        return [Open(row["id"], row["key"][1], row["key"][2]) for row in rows]

    def leases_due(self, creator: str, cutoff: str) -> list[str]:
        rows = self.db.view(DDOC, "leases", startkey=[creator], endkey=[creator, cutoff],
                            update=SCAN_INDEX)
        return [row["id"] for row in rows]

    def involving(self, site: str) -> Iterator[str]:
        return (row["id"] for row in iter_view(self.db, DDOC, "involving", key=site))

    def open_created(self, creator: str, limit: int) -> list[str]:
        rows = self.db.view(DDOC, "stale_open", startkey=[creator], endkey=[creator, {}],
                            limit=limit, update=SCAN_INDEX)
        return [row["id"] for row in sorted(rows, key=keepalive.row_rank)]

    def statuses(self) -> list[Doc]:
        rows = self.db.all_docs(startkey=status.PREFIX, endkey=status.PREFIX + "\ufff0",
                                include_docs=True)
        return [row["doc"] for row in rows if row.get("doc")]

    def waiting(self, creator: str) -> list[str]:
        return [row["id"] for row in iter_view(self.db, DDOC, "waiting", startkey=[creator],
                                               endkey=[creator, {}])]

    def waiting_on(self, ids: Sequence[str]) -> list[tuple[str, str]]:
        rows = self.db.view(DDOC, "waiting_on", keys=list(ids))
        return [(row["id"], row["value"]) for row in rows]

    def load_checkpoint(self, site: str) -> object:
        """Where `site`'s changes feed stopped (0 at first)."""
        saved = self.db.get_local(f"{CHECKPOINT}-{site}")
        return saved["seq"] if saved else 0

    def save_checkpoint(self, site: str, seq: object) -> None:
        self.db.put_local(f"{CHECKPOINT}-{site}", {"seq": seq})
