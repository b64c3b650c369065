"""Idempotent writes of the documents that set CouchDB up: design documents and replications.

Each is written only when what we want differs from what is stored, so a daemon
or `jobdist setup` may write them at every start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .couch import Database, SaveResult, require_id
from .model import Doc

# Fields the replicator itself adds to a replication document.
_REPLICATOR_OWNED = frozenset({"owner"})


def sync_design_docs(db: Database, docs: list[Doc]) -> list[str]:
    """Write each design document whose content (ignoring `_rev`) changed; ids written."""
    return [doc["_id"] for doc in docs if _sync_design_doc(db, doc)]


def _sync_design_doc(db: Database, doc: Doc) -> bool:
    doc_id = require_id(doc)
    return _put_if_changed(db, doc_id, _content(doc), _content,
                           f"write design document {doc_id!r} to {db.url}")


def put_replication(
    replicator: Database,
    doc_id: str,
    source: str,
    target: str,
    *,
    continuous: bool = True,
    filter: str | None = None,
    query_params: dict[str, Any] | None = None,
) -> bool:
    """Create or update a replication document in `replicator` (a `_replicator` database).

    Idempotent: only writes when the replication settings differ; True when
    written. Never writes `selector` (it crashes pouchdb-server for good).
    On pouchdb-server a missing `filter` on the source raises NotFound
    before anything is written (it would crash the server too), and a
    running (`triggered`) replication cannot be edited: that raises
    Forbidden (and deleting one crashes the server, so we never do).
    Source and target may hold credentials: they never go into messages.
    """
    if not replicator.name.endswith("_replicator"):
        raise ValueError(f"put_replication needs a _replicator database, not {replicator.name!r}")
    couch = replicator.couch
    wanted: Doc = {"source": source, "target": target, "continuous": continuous}
    if filter is not None:
        if not couch.is_apache_couchdb():  # it would crash for good, at every start
            couch.endpoint(source).require_filter(filter)
        wanted["filter"] = filter
    if query_params:
        wanted["query_params"] = query_params
    if not couch.is_apache_couchdb():
        # pouchdb-server checkpoints at both ends after every batch by default:
        # a quarter of its requests. CouchDB checkpoints on a timer already.
        wanted["checkpoint"] = False
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
