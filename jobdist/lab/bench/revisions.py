"""Counting revisions: each written once at its origin, and the copies replication wrote.

pouchdb-server raises a database's `update_seq` by one for every revision written
into it, by a client or by a replicator (`_local` documents excluded), so the
copies replication wrote into all the sites are Σ Δ`update_seq` less the
revisions written at their origin: the jobs' distinct revisions and the sites'
own status documents. (pouchdb-server's `_active_tasks` is a stub, and a
continuous replication never writes its `_replication_stats`: the counters are
what it offers.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ...couch import Database
from ...model import Doc
from ...status import status_id

REVISIONS_BATCH = 500  # leaves a `_bulk_get` of count_revisions reads at once


@dataclass(frozen=True)
class Revisions:
    """Every revision of some documents: the winning branches, conflicts and deletions."""

    total: int  # distinct revisions in the revision trees, creations included
    conflict_leaves: int  # leaves beside the winner, live or deleted


def revision_trees(db: Database, ids: list[str]) -> dict[str, tuple[set[str], int]]:
    """For each of some documents: the ids of every revision in its tree, and how many
    leaves it has (a document this database lacks is left out).

    One `_changes` with `style=all_docs` names every leaf, deleted ones included (the
    SDK has no `open_revs`); `_bulk_get` with `revs` brings their histories, in batches.
    (A `_changes` filtered by id for each document read the whole feed each time: a
    4,000-job run spent minutes counting.)
    """
    client = db.couch.client
    wanted_ids = set(ids)
    feed = db.couch.call("list the leaves", client.post_changes, db.name, style="all_docs")
    # (A clustered CouchDB may list a document twice: each leaf once.)
    wanted = [{"id": doc_id, "rev": rev} for doc_id, rev in dict.fromkeys(
        (result["id"], change["rev"]) for result in feed["results"]
        if result["id"] in wanted_ids for change in result["changes"])]
    trees: dict[str, tuple[set[str], int]] = {}
    for first in range(0, len(wanted), REVISIONS_BATCH):
        answer = db.couch.call("read the leaves", client.post_bulk_get, db.name,
                               docs=wanted[first:first + REVISIONS_BATCH], revs=True)
        for result in answer["results"]:
            for item in result["docs"]:
                if "ok" in item:
                    revs, leaves = trees.setdefault(result["id"], (set(), 0))
                    trees[result["id"]] = (revs | history_revs(item["ok"]), leaves + 1)
    return trees


def history_revs(leaf: Doc) -> set[str]:
    history = leaf.get("_revisions") or {}
    start = history.get("start", 0)
    return {f"{start - i}-{rev}" for i, rev in enumerate(history.get("ids", []))}


def count_revisions(db: Database, ids: list[str]) -> Revisions:
    trees = revision_trees(db, ids).values()
    return Revisions(sum(len(revs) for revs, _ in trees),
                     sum(leaves - 1 for _, leaves in trees))


def distinct_revisions(dbs: dict[str, Database], ids: list[str]) -> int:
    """Revisions in the union of every site's trees: each was written once, at its origin."""
    union: dict[str, set[str]] = {}
    for db in dbs.values():
        for doc_id, (revs, _) in revision_trees(db, ids).items():
            union.setdefault(doc_id, set()).update(revs)
    return sum(len(revs) for revs in union.values())


def status_writes(dbs: dict[str, Database]) -> int:
    """Revisions of the sites' status documents, each counted at its own site."""
    total = 0
    for name, db in dbs.items():
        doc = db.get(status_id(name))
        total += int(doc["_rev"].split("-")[0]) if doc else 0
    return total


def update_seqs(dbs: dict[str, Database]) -> dict[str, int]:
    # pouchdb-server's seqs are integers: one per revision written, _local docs excluded.
    return {name: int(db.info()["update_seq"]) for name, db in dbs.items()}


def wait_until_quiet(dbs: dict[str, Database], quiet: float = 1.5,
                     timeout: float = 60.0) -> dict[str, int]:
    """The update seqs once no site has written anything for `quiet` seconds."""
    deadline = time.monotonic() + timeout
    last, since = update_seqs(dbs), time.monotonic()
    while time.monotonic() - since < quiet and time.monotonic() < deadline:
        time.sleep(0.25)
        now = update_seqs(dbs)
        if now != last:
            last, since = now, time.monotonic()
    return last


@dataclass(frozen=True)
class Writes:
    """What every site wrote over a run: at the origin, and copies by replication."""

    job_revisions: int  # distinct revisions of the jobs, creations included
    status_revisions: int  # the sites' own status documents
    replicated: int  # copies replication wrote into the sites, jobs' and statuses'


class WriteCounter:
    """Started before a run, read after it: `update_seq` deltas against origin writes."""

    def __init__(self, dbs: dict[str, Database]) -> None:
        self.dbs = dbs
        self.statuses_before = status_writes(dbs)
        self.seqs_before = update_seqs(dbs)

    def writes(self, ids: list[str]) -> Writes:
        """Once replication has settled (no write for a moment), what was written."""
        after = wait_until_quiet(self.dbs)
        statuses = status_writes(self.dbs) - self.statuses_before
        revisions = distinct_revisions(self.dbs, ids)
        written = sum(after.values()) - sum(self.seqs_before.values())
        return Writes(revisions, statuses, written - revisions - statuses)
