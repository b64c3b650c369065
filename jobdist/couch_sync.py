"""Idempotent writes of the documents that set CouchDB up: design documents and replications.

Each is written only when what we want differs from what is stored, so a daemon
or `jobdist setup` may write them at every start.
"""

from __future__ import annotations

from collections.abc import Callable

from .couch import CouchError, Database, SaveResult, require_id
from .design import DESIGN_VERSION, design_version
from .model import Doc

# Fields the replicator itself adds to a replication document.
_REPLICATOR_OWNED = frozenset({"owner"})


def sync_design_docs(db: Database, docs: list[Doc],
                     on_newer: Callable[[str, int], None] | None = None) -> list[str]:
    """Write each design document whose content (ignoring `_rev`) changed, unless the
    stored one is of a newer version (newer_design_docs, each told to `on_newer` with
    its version): ids written."""
    newer = newer_design_docs(db, docs)
    for doc_id, version in newer.items():
        if on_newer is not None:
            on_newer(doc_id, version)
    return [doc["_id"] for doc in docs if doc["_id"] not in newer and _sync_design_doc(db, doc)]


def newer_design_docs(db: Database, docs: list[Doc]) -> dict[str, int]:
    """The stored versions of these design documents where a newer jobdist wrote them:
    an older release never downgrades them (design.DESIGN_VERSION)."""
    stored = {doc["_id"]: design_version(db.get(doc["_id"])) for doc in docs}
    return {doc_id: version for doc_id, version in stored.items()
            if version > DESIGN_VERSION}


def _sync_design_doc(db: Database, doc: Doc) -> bool:
    doc_id = require_id(doc)
    return _put_if_changed(db, doc_id, _content(doc), _content,
                           f"write design document {doc_id!r} to {db.url}")


def put_replication(replicator: Database, doc_id: str, wanted: Doc) -> bool:
    """Create or update the replication document `doc_id` in `replicator` (a `_replicator`
    database) to hold `wanted` (topology.replication_doc builds it).

    Idempotent: only writes when the replication settings differ; True when
    written. pouchdb-server crashes for good on a `selector`, and on a
    missing `filter` on the source (an unhandled rejection at every start):
    both raise a CouchError there before anything is written. On it a running
    (`triggered`) replication cannot be edited either: that raises Forbidden
    (and deleting one crashes the server, so we never do). Source and target
    may hold credentials: they never go into messages.
    """
    if not replicator.name.endswith("_replicator"):
        raise ValueError(f"put_replication needs a _replicator database, not {replicator.name!r}")
    couch = replicator.couch
    if not couch.is_apache_couchdb():
        if "selector" in wanted:
            raise CouchError(f"replication {doc_id!r} not written to {replicator.url}: "
                             "its selector would crash pouchdb-server")
        if "filter" in wanted:
            couch.endpoint(wanted["source"]).require_filter(wanted["filter"])
    # Conflicts are expected: the replicator writes its state into the document.
    return _put_if_changed(replicator, doc_id, wanted, _replication_settings,
                           f"write replication {doc_id!r} to {replicator.url}")


def _put_if_changed(db: Database, doc_id: str, wanted: Doc, settings: Callable[[Doc], Doc],
                    what: str) -> bool:
    """Write `wanted` unless the stored document's `settings` equal it; True if written."""
    changed = False

    def write() -> SaveResult | None:
        nonlocal changed  # decided afresh by each attempt: only the last one counts
        current = db.get(doc_id)
        changed = current is None or settings(current) != wanted
        return db.save(_with_rev(wanted | {"_id": doc_id}, current)) if changed else None

    db.write_until_saved(write, what)
    return changed


def _content(doc: Doc) -> Doc:
    return {k: v for k, v in doc.items() if k not in ("_rev", "_revisions", "_conflicts")}


def _with_rev(doc: Doc, current: Doc | None) -> Doc:
    return doc if current is None else doc | {"_rev": current["_rev"]}


def _replication_settings(doc: Doc) -> Doc:
    """The fields we write; the replicator's own (`_replication_*`, `owner`) do not count."""
    return {k: v for k, v in doc.items() if not k.startswith("_") and k not in _REPLICATOR_OWNED}
