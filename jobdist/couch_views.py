"""Every row of a view query, page by page.

Views page here, not by the Cloudant SDK's view pager: that pager restarts a
page at `start_key_doc_id`, which pouchdb-server ignores, so rows sharing a key
(all the `involving` view's rows do) would repeat for ever.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Mapping
from typing import Any

from .couch import Database
from .couch_sdk import sdk_params
from .model import Doc


def iter_view(
    db: Database, ddoc: str, view: str, *, page_size: int = 200, **params: Any
) -> Generator[Doc, None, None]:
    """Every row of a view query, fetched `page_size` rows at a time.

    Pages restart at the first row not yet yielded, by key and (on CouchDB)
    document id: no `skip`, so a page costs the same however deep it is.
    pouchdb-server ignores `startkey_docid`, so there we skip only the rows
    already yielded that share the restart key.
    """
    if page_size < 1:
        raise ValueError("page_size must be at least 1")
    if "keys" in params or "skip" in params:
        raise ValueError("iter_view pages by startkey: keys and skip are not supported")
    query = _normalise_range(params)
    remaining: int | None = query.pop("limit", None)
    by_docid = db.couch.is_apache_couchdb()
    run_key, run_length = None, 0  # the last key yielded, and how many rows had it
    while remaining is None or remaining > 0:
        want = page_size if remaining is None else min(page_size, remaining)
        rows = db.view(ddoc, view, **query, limit=want + 1)
        for row in rows[:want]:
            key = _key_token(row.get("key"))
            run_key, run_length = key, (run_length + 1 if key == run_key else 1)
            yield row
        if remaining is not None:
            remaining -= min(want, len(rows))
        if len(rows) <= want:
            return
        _restart_at(query, rows[want], by_docid, run_length, run_key)


def _normalise_range(params: Mapping[str, Any]) -> dict[str, Any]:
    """The query under the SDK's names (`startkey` → `start_key`), `key` turned into a range."""
    query = sdk_params(params)
    if "key" in query:
        query["start_key"] = query["end_key"] = query.pop("key")
        query.pop("inclusive_end", None)
    return query


def _key_token(key: Any) -> str:
    # Compare keys as JSON: in Python True == 1, in CouchDB collation they differ.
    return json.dumps(key, sort_keys=True)


def _restart_at(
    query: dict[str, Any], row: Doc, by_docid: bool, run_length: int, run_key: str | None
) -> None:
    """Point `query` at `row`, the first row not yet yielded."""
    query["start_key"] = row.get("key")
    query.pop("skip", None)
    query.pop("start_key_doc_id", None)
    if by_docid and "id" in row:
        query["start_key_doc_id"] = row["id"]
    elif _key_token(row.get("key")) == run_key:
        query["skip"] = run_length  # rows with this key that were yielded already
