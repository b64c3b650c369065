"""CouchDB access layer: one `Couch` per server, one `Database` per database.

Everything goes over `requests` so that the same code talks to Apache CouchDB 3
(production) and pouchdb-server 4.2 (local cluster and tests). The differences
that matter are handled here:

* `_changes` sequences are strings on CouchDB and integers on pouchdb-server, so
  they are opaque values: never compared, only handed back as `since`.
* pouchdb-server has no `feed=eventsource` and gzips responses when asked to,
  which buffers a continuous feed; streams therefore ask for no compression.
* pouchdb-server ignores `startkey_docid` and returns `_bulk_docs` results out
  of order; `iter_view` and `bulk_docs` cope with both.

Credentials never appear in `url` attributes or in error messages.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import requests
import sseclient
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

log = logging.getLogger("jobdist.couch")

Doc = dict[str, Any]

# View parameters CouchDB wants as JSON (a string key must arrive quoted).
_JSON_PARAMS = frozenset({"key", "keys", "startkey", "endkey", "start_key", "end_key"})
# The 404 reasons meaning "no such database" rather than "no such document".
_NO_DB_REASONS = frozenset({"Database does not exist.", "no_db_file"})
# Fields the replicator itself adds to a replication document.
_REPLICATOR_OWNED = frozenset({"owner"})
_BULK_GET_CHUNK = 500
_WRITE_ATTEMPTS = 3


class CouchError(Exception):
    """Any failure talking to CouchDB. The message is one line without credentials."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        error: str | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.reason = reason


class NotFound(CouchError):
    """The database (or, where a method says so, the document) does not exist."""


class Forbidden(CouchError):
    """401/403, e.g. a validate_doc_update refusal; `.reason` is CouchDB's text."""

    reason: str


class Undecodable(CouchError):
    """The server answered, but not with JSON we can read (e.g. nested too deeply)."""


class Unavailable(CouchError):
    """Connection error, timeout or 5xx that outlasted the retries: back off and retry later."""


@dataclass(frozen=True)
class Saved:
    id: str
    rev: str


@dataclass(frozen=True)
class Conflict:
    """409: someone else wrote first; re-read and decide again (never overwrite blindly)."""

    id: str


@dataclass(frozen=True)
class Rejected:
    """A per-document refusal in `_bulk_docs`, e.g. `forbidden` from validate_doc_update."""

    id: str
    error: str
    reason: str


SaveResult = Saved | Conflict


@dataclass(frozen=True)
class Change:
    seq: object  # opaque: str on CouchDB, int on pouchdb-server
    id: str
    revs: list[str]
    deleted: bool
    doc: Doc | None


class _ServerError(Exception):
    """A 5xx answer, raised inside the retry loop so that tenacity retries it."""

    def __init__(self, response: requests.Response) -> None:
        super().__init__(response.status_code)
        self.response = response


# Worth another try: the server may be restarting, overloaded or briefly unreachable.
_UNREACHABLE = (
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,
)
_TRANSIENT = (*_UNREACHABLE, _ServerError)


class Couch:
    """One CouchDB server, with its own `requests.Session`."""

    def __init__(
        self,
        url: str,
        *,
        user: str | None = None,
        password: str | None = None,
        timeout: float = 30.0,
        retries: int = 4,
        retry_time: float = 10.0,
    ) -> None:
        self.url, url_user, url_password = _split_credentials(url)
        user = user if user is not None else url_user
        self._password = password if password is not None else url_password
        self.timeout = timeout
        self.retries = retries
        self.retry_time = retry_time
        self.session = requests.Session()
        self.session.headers["Accept"] = "application/json"
        if user is not None:
            self.session.auth = (user, self._password or "")
        self._apache: bool | None = None

    def __repr__(self) -> str:
        return f"Couch({self.url!r})"

    def info(self) -> Doc:
        return self._fetch("GET", self.url, what=f"read server info of {self.url}")

    def is_apache_couchdb(self) -> bool:
        # Cached: the answer decides protocol details on every feed and page.
        if self._apache is None:
            self._apache = "couchdb" in self.info()
        return self._apache

    def session_user(self) -> str | None:
        """The user this connection logs in as; None when anonymous or refused."""
        resp = self._send("GET", f"{self.url}/_session", what=f"read the session at {self.url}")
        if resp.status_code != 200:
            return None
        return self._check(resp, what="read the session").get("userCtx", {}).get("name")

    def database(self, name: str) -> Database:
        return Database(self, name)

    def ensure_database(self, name: str) -> Database:
        db = self.database(name)
        resp = self._send("PUT", db.url, what=f"create database {db.url}")
        if resp.status_code != 412:  # 412: it exists already, which is all we want
            self._check(resp, what=f"create database {db.url}")
        return db

    def replicator(self) -> Database:
        return self.ensure_database("_replicator")

    def put_replication(self, doc_id: str, source: str, target: str, **options: Any) -> bool:
        """`Database.put_replication` on this server's `_replicator` database."""
        return self.replicator().put_replication(doc_id, source, target, **options)

    # -- HTTP plumbing, shared with Database ----------------------------------------

    def _send(
        self, method: str, url: str, *, what: str, retry: bool = True, **kwargs: Any
    ) -> requests.Response:
        """One request, retried on connection errors, timeouts and 5xx; 4xx are returned."""
        kwargs.setdefault("timeout", self.timeout)

        def attempt() -> requests.Response:
            resp = self.session.request(method, url, **kwargs)
            log.debug("%s %s -> %s", method, url, resp.status_code)
            if resp.status_code >= 500:
                raise _ServerError(resp)
            return resp

        try:
            return self._retrying(what)(attempt) if retry else attempt()
        except _ServerError as exc:
            raise self._http_error(exc.response, what) from None
        except requests.RequestException as exc:
            raise self._transport_error(exc, what) from exc

    def _fetch(self, method: str, url: str, *, what: str, **kwargs: Any) -> Any:
        return self._check(self._send(method, url, what=what, **kwargs), what=what)

    def _check(self, resp: requests.Response, *, what: str) -> Any:
        """The decoded body of a 2xx answer; any other status raises."""
        if resp.status_code >= 300:
            raise self._http_error(resp, what)
        try:
            return resp.json()
        except (ValueError, RecursionError) as error:  # Recursion: nested too deep for us
            raise Undecodable(self._clean(f"{what}: the answer is not JSON we can read: "
                                          f"{type(error).__name__}")) from None

    def _http_error(self, resp: requests.Response, what: str) -> CouchError:
        status = resp.status_code
        error, reason = _error_fields(resp)
        cls: type[CouchError] = CouchError
        if status == 404:
            cls = NotFound
        elif status in (401, 403):
            cls = Forbidden
        elif status >= 500:
            cls = Unavailable
        message = self._clean(f"{what} failed: HTTP {status} {error}: {reason}")
        return cls(message, status=status, error=error, reason=self._clean(reason))

    def _transport_error(self, exc: BaseException, what: str) -> CouchError:
        cls = Unavailable if isinstance(exc, _UNREACHABLE) else CouchError
        return cls(self._clean(f"{what} failed: {type(exc).__name__}: {str(exc)[:300]}"))

    def _retrying(self, what: str) -> Retrying:
        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.debug("retrying %s after attempt %d: %r", what, state.attempt_number, exc)

        return Retrying(
            stop=stop_after_attempt(self.retries) | stop_after_delay(self.retry_time),
            wait=wait_exponential(multiplier=0.25, max=4),
            retry=retry_if_exception_type(_TRANSIENT),
            before_sleep=before_sleep,
            reraise=True,
        )

    def _clean(self, text: str) -> str:
        """One line, and no password even if a server or library echoed it."""
        text = " ".join(text.split())
        secret = self._password
        if secret and len(secret) >= 3:  # a shorter one would garble the whole text
            text = text.replace(secret, "***").replace(quote(secret, safe=""), "***")
        return text


class Database:
    """One database on a `Couch` server."""

    def __init__(self, couch: Couch, name: str) -> None:
        self.couch = couch
        self.name = name
        self.url = f"{couch.url}/{quote(name, safe='')}"

    def __repr__(self) -> str:
        return f"Database({self.url!r})"

    def info(self) -> Doc:
        return self.couch._fetch("GET", self.url, what=f"read database info of {self.url}")

    def exists(self) -> bool:
        try:
            self.info()
        except NotFound:
            return False
        return True

    def last_seq(self) -> object:
        return self.info()["update_seq"]

    def security(self) -> Doc:
        return self.couch._fetch("GET", f"{self.url}/_security",
                                 what=f"read _security of {self.url}")

    def put_security(self, security: Doc) -> None:
        self.couch._fetch("PUT", f"{self.url}/_security", json=security,
                          what=f"write _security of {self.url}")

    # -- documents ------------------------------------------------------------------

    def get(self, doc_id: str, *, conflicts: bool = False, rev: str | None = None) -> Doc | None:
        """The document (winning revision unless `rev`), or None when it does not exist."""
        params = {"conflicts": "true"} if conflicts else {}
        if rev is not None:
            params["rev"] = rev
        what = f"get {doc_id!r} from {self.url}"
        resp = self.couch._send("GET", self.doc_url(doc_id), what=what, params=params)
        if self._doc_missing(resp):
            return None
        return self.couch._check(resp, what=what)

    def leaves(self, doc_id: str) -> list[Doc]:
        """All live leaf revisions (the winner and its conflicts); [] when there is none."""
        what = f"read leaf revisions of {doc_id!r} in {self.url}"
        resp = self.couch._send("GET", self.doc_url(doc_id), what=what, params={"open_revs": "all"})
        if self._doc_missing(resp):
            return []
        found = self.couch._check(resp, what=what)
        return [r["ok"] for r in found if "ok" in r and not r["ok"].get("_deleted")]

    def leaves_many(self, ids: Iterable[str]) -> dict[str, list[Doc]]:
        """The live leaf revisions of many documents, by id ([] for a missing or deleted one).

        One `_all_docs` request brings every winner with its `_conflicts`; one
        `_bulk_get` brings the losing leaves of the conflicted ones. Per document,
        `leaves` would cost a request each.
        """
        wanted = list(dict.fromkeys(ids))
        found: dict[str, list[Doc]] = {}
        losers: list[Doc] = []
        for doc in self.bulk_get(wanted, conflicts=True):
            found[doc["_id"]] = [doc]
            losers += [{"id": doc["_id"], "rev": rev} for rev in doc.pop("_conflicts", [])]
        for start in range(0, len(losers), _BULK_GET_CHUNK):
            what = f"read conflicting revisions in {self.url}"
            answer = self.couch._fetch("POST", f"{self.url}/_bulk_get", what=what,
                                       json={"docs": losers[start : start + _BULK_GET_CHUNK]})
            for result in answer["results"]:
                found[result["id"]] += [item["ok"] for item in result["docs"]
                                        if "ok" in item and not item["ok"].get("_deleted")]
        return {doc_id: found.get(doc_id, []) for doc_id in wanted}

    def save(self, doc: Doc) -> SaveResult:
        """PUT one document (with `_rev` to update it). 409 gives Conflict; other errors raise."""
        doc_id = _require_id(doc)
        what = f"save {doc_id!r} to {self.url}"
        resp = self.couch._send("PUT", self.doc_url(doc_id), what=what, json=doc)
        if resp.status_code == 409:
            return Conflict(doc_id)
        body = self.couch._check(resp, what=what)
        return Saved(body["id"], body["rev"])

    def delete(self, doc_id: str, rev: str) -> SaveResult:
        what = f"delete {doc_id!r} from {self.url}"
        resp = self.couch._send("DELETE", self.doc_url(doc_id), what=what, params={"rev": rev})
        if resp.status_code == 409:
            return Conflict(doc_id)
        body = self.couch._check(resp, what=what)
        return Saved(body["id"], body["rev"])

    def bulk_docs(self, docs: list[Doc]) -> list[Saved | Conflict | Rejected]:
        """Write many documents; one result per input document, in input order.

        Documents without `_id` get a random one first: that makes a retried
        request harmless (it comes back as conflicts) and lets us match results
        by id, which we must since pouchdb-server does not keep input order.
        """
        docs = [doc if doc.get("_id") else {**doc, "_id": uuid.uuid4().hex} for doc in docs]
        if not docs:
            return []
        what = f"bulk write {len(docs)} documents to {self.url}"
        answer = self.couch._fetch("POST", f"{self.url}/_bulk_docs", what=what, json={"docs": docs})
        by_id: dict[str, deque[Doc]] = defaultdict(deque)
        for result in answer:
            by_id[result.get("id", "")].append(result)
        results = []
        for doc in docs:
            if not by_id[doc["_id"]]:
                raise CouchError(self.couch._clean(f"{what}: no result for {doc['_id']!r}"))
            results.append(_bulk_result(by_id[doc["_id"]].popleft()))
        return results

    def bulk_get(self, ids: list[str], *, conflicts: bool = False) -> list[Doc]:
        """The current winning documents for those of `ids` that exist, in order."""
        params = {"include_docs": "true"}
        if conflicts:
            params["conflicts"] = "true"
        docs: list[Doc] = []
        for start in range(0, len(ids), _BULK_GET_CHUNK):
            keys = ids[start : start + _BULK_GET_CHUNK]
            rows = self._rows("_all_docs", dict(params, keys=keys), "read documents")
            docs += [row["doc"] for row in rows if row.get("doc")]
        return docs

    def get_local(self, name: str) -> Doc | None:
        return self.get(f"_local/{name}")

    def put_local(self, name: str, body: Doc) -> None:
        """Overwrite the `_local/<name>` document (not replicated) with `body`."""
        doc_id = f"_local/{name}"

        def write() -> SaveResult:
            current = self.get(doc_id)
            doc = {k: v for k, v in body.items() if k != "_rev"} | {"_id": doc_id}
            if current is not None:  # pouchdb-server's local revs look like "0-1"
                doc["_rev"] = current["_rev"]
            return self.save(doc)

        self._write_until_saved(write, f"write {doc_id!r} to {self.url}")

    # -- views ----------------------------------------------------------------------

    def view(self, ddoc: str, view: str, **params: Any) -> list[Doc]:
        """The rows of a view query; key-like parameters are JSON-encoded for you."""
        return self._rows(_view_path(ddoc, view), params, f"query view {ddoc}/{view}")

    def all_docs(self, **params: Any) -> list[Doc]:
        return self._rows("_all_docs", params, "list documents")

    def iter_view(
        self, ddoc: str, view: str, *, page_size: int = 200, **params: Any
    ) -> Iterator[Doc]:
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
        by_docid = self.couch.is_apache_couchdb()
        run_key, run_length = None, 0  # the last key yielded, and how many rows had it
        while remaining is None or remaining > 0:
            want = page_size if remaining is None else min(page_size, remaining)
            rows = self.view(ddoc, view, **query, limit=want + 1)
            for row in rows[:want]:
                key = _key_token(row.get("key"))
                run_key, run_length = key, (run_length + 1 if key == run_key else 1)
                yield row
            if remaining is not None:
                remaining -= min(want, len(rows))
            if len(rows) <= want:
                return
            _restart_at(query, rows[want], by_docid, run_length, run_key)

    # -- changes --------------------------------------------------------------------

    def changes(
        self,
        since: object = 0,
        *,
        include_docs: bool = False,
        feed: str = "auto",
        heartbeat_ms: int = 10000,
        filter: str | None = None,
        stop: threading.Event | None = None,
        timeout: float | None = None,
        style: str = "main_only",
        query_params: Mapping[str, Any] | None = None,
    ) -> Iterator[Change]:
        """Changes after `since` (an opaque seq from an earlier Change or `last_seq`).

        feed="normal" returns after the current batch; "continuous" and
        "eventsource" stream until the server closes the stream, `stop` is set
        or `timeout` seconds have passed. Both are checked between lines, and
        the server sends a heartbeat every `heartbeat_ms`, so a stop is noticed
        within about one heartbeat. "auto" picks eventsource on Apache CouchDB
        and continuous elsewhere (pouchdb-server has no eventsource). Streams
        connect on the first `next()` and are not retried: reconnecting is the
        caller's decision. feed="normal" reads its batch when called.
        """
        if feed == "auto":
            feed = "eventsource" if self.couch.is_apache_couchdb() else "continuous"
        params = {
            "since": since if isinstance(since, str) else json.dumps(since),
            "include_docs": json.dumps(include_docs),
            "style": style,
            **{k: _plain_param(v) for k, v in (query_params or {}).items()},
        }
        if filter is not None:
            if not filter.startswith("_") and not self.couch.is_apache_couchdb():
                self.require_filter(filter)
            params["filter"] = filter
        if feed == "normal":
            return self._changes_batch(params, timeout)
        if feed not in ("continuous", "eventsource"):
            raise ValueError(f"unknown changes feed {feed!r}")
        params |= {"feed": feed, "heartbeat": str(heartbeat_ms)}
        return self._changes_stream(params, heartbeat_ms / 1000, stop, timeout)

    def _changes_batch(self, params: dict[str, str], timeout: float | None) -> Iterator[Change]:
        what = f"read changes of {self.url}"
        body = self.couch._fetch(
            "GET",
            f"{self.url}/_changes",
            what=what,
            params=params,
            timeout=timeout or self.couch.timeout,
        )
        return iter([_change(item) for item in body["results"]])

    def _changes_stream(
        self,
        params: dict[str, str],
        heartbeat: float,
        stop: threading.Event | None,
        timeout: float | None,
    ) -> Iterator[Change]:
        what = f"follow changes of {self.url}"
        deadline = None if timeout is None else time.monotonic() + timeout

        def should_stop() -> bool:
            return (stop is not None and stop.is_set()) or (
                deadline is not None and time.monotonic() >= deadline
            )

        resp = self.couch._send(
            "GET",
            f"{self.url}/_changes",
            what=what,
            retry=False,
            params=params,
            stream=True,
            # A read timeout a little above the heartbeat notices a dead connection;
            # identity encoding because a gzipped stream is buffered by the server.
            timeout=(self.couch.timeout, heartbeat * 1.5 + 1.0),
            headers={"Accept-Encoding": "identity"},
        )
        with resp:
            if resp.status_code >= 300:
                raise self.couch._http_error(resp, what)
            parse = _eventsource_items if params["feed"] == "eventsource" else _continuous_items
            try:
                for item in parse(_chunks(resp, should_stop)):
                    if should_stop() or "id" not in item:  # {"last_seq": ...} ends the feed
                        return
                    yield _change(item)
            except requests.RequestException as exc:
                raise self.couch._transport_error(exc, what) from exc
            except ValueError as exc:
                raise CouchError(self.couch._clean(f"{what}: bad feed line: {exc}")) from exc

    # -- design and replication documents -------------------------------------------

    def sync_design_docs(self, docs: list[Doc]) -> list[str]:
        """Write each design document whose content (ignoring `_rev`) changed; ids written."""
        return [doc["_id"] for doc in docs if self._sync_design_doc(doc)]

    def _sync_design_doc(self, doc: Doc) -> bool:
        doc_id = _require_id(doc)
        return self._put_if_changed(doc_id, _content(doc), _content,
                                    f"write design document {doc_id!r} to {self.url}")

    def _put_if_changed(self, doc_id: str, wanted: Doc, settings: Callable[[Doc], Doc],
                        what: str) -> bool:
        """Write `wanted` unless the stored document's `settings` equal it; True if written."""
        changed = False

        def write() -> SaveResult | None:
            nonlocal changed  # decided afresh by each attempt: only the last one counts
            current = self.get(doc_id)
            changed = current is None or settings(current) != wanted
            return self.save(_with_rev(wanted | {"_id": doc_id}, current)) if changed else None

        self._write_until_saved(write, what)
        return changed

    def put_replication(
        self,
        doc_id: str,
        source: str,
        target: str,
        *,
        continuous: bool = True,
        filter: str | None = None,
        query_params: dict[str, Any] | None = None,
    ) -> bool:
        """Create or update a replication document in this (`_replicator`) database.

        Idempotent: only writes when the replication settings differ; True when
        written. Never writes `selector` (it crashes pouchdb-server for good).
        On pouchdb-server a missing `filter` on the source raises NotFound
        before anything is written (it would crash the server too), and a
        running (`triggered`) replication cannot be edited: that raises
        Forbidden (and deleting one crashes the server, so we never do).
        Source and target may hold credentials: they never go into messages.
        """
        if not self.name.endswith("_replicator"):
            raise ValueError(f"put_replication needs a _replicator database, not {self.name!r}")
        wanted: Doc = {"source": source, "target": target, "continuous": continuous}
        if filter is not None:
            if not self.couch.is_apache_couchdb():  # it would crash for good, at every start
                self._peer_database(source).require_filter(filter)
            wanted["filter"] = filter
        if query_params:
            wanted["query_params"] = query_params
        if not self.couch.is_apache_couchdb():
            # pouchdb-server checkpoints at both ends after every batch by default:
            # a quarter of its requests. CouchDB checkpoints on a timer already.
            wanted["checkpoint"] = False
        # Conflicts are expected: the replicator writes its state into the document.
        return self._put_if_changed(doc_id, wanted, _replication_settings,
                                    f"write replication {doc_id!r} to {self.url}")

    def require_filter(self, filter: str) -> None:
        """Raise NotFound unless this database has the filter function `ddoc/name`.

        pouchdb-server crashes on a missing filter (an unhandled rejection in
        node), so on it we check before any feed or replication uses one.
        """
        ddoc, _, name = filter.partition("/")
        design = self.get(f"_design/{ddoc}") if ddoc and name else None
        if design is None or name not in design.get("filters", {}):
            raise NotFound(
                self.couch._clean(f"filter {filter!r} does not exist in {self.url}"),
                status=404,
                error="not_found",
                reason="missing filter",
            )

    def _peer_database(self, address: str) -> Database:
        """A replication endpoint (database URL, or a name on this server) as a Database."""
        if "://" not in address:
            return self.couch.database(address)
        clean, user, password = _split_credentials(address)
        base, _, name = clean.rpartition("/")
        peer = Couch(
            base,
            user=user,
            password=password,
            timeout=self.couch.timeout,
            retries=self.couch.retries,
            retry_time=self.couch.retry_time,
        )
        return peer.database(unquote(name))

    # -- helpers --------------------------------------------------------------------

    def doc_url(self, doc_id: str) -> str:
        # The slash after _design/ and _local/ is part of the path, not of the name.
        for prefix in ("_design/", "_local/"):
            if doc_id.startswith(prefix):
                return f"{self.url}/{prefix}{quote(doc_id[len(prefix) :], safe='')}"
        return f"{self.url}/{quote(doc_id, safe='')}"

    def _doc_missing(self, resp: requests.Response) -> bool:
        """A 404 about the document; a 404 about the database is not hidden."""
        return resp.status_code == 404 and _error_fields(resp)[1] not in _NO_DB_REASONS

    def _rows(self, path: str, params: Mapping[str, Any], action: str) -> list[Doc]:
        what = f"{action} in {self.url}"
        query = {k: v for k, v in params.items() if k != "keys"}
        url, encoded = f"{self.url}/{path}", _encode_params(query)
        if "keys" in params:  # POST: a long key list would not fit in a URL
            body = {"keys": params["keys"]}
            answer = self.couch._fetch("POST", url, what=what, params=encoded, json=body)
        else:
            answer = self.couch._fetch("GET", url, what=what, params=encoded)
        return answer["rows"]

    def _write_until_saved(self, write: Callable[[], SaveResult | None], what: str) -> None:
        """Run read-decide-write `write` again after a Conflict; None means nothing to do."""
        for _ in range(_WRITE_ATTEMPTS):
            if not isinstance(write(), Conflict):
                return
        raise CouchError(
            self.couch._clean(f"{what} failed: still conflicting after {_WRITE_ATTEMPTS} tries"),
            status=409,
            error="conflict",
        )


# -- module helpers -------------------------------------------------------------------


def _split_credentials(url: str) -> tuple[str, str | None, str | None]:
    """(url without user info and trailing slash, user, password)."""
    parts = urlsplit(url)
    if parts.username is None:
        return url.rstrip("/"), None, None
    host = parts.netloc.rpartition("@")[2]
    clean = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    password = None if parts.password is None else unquote(parts.password)
    return clean.rstrip("/"), unquote(parts.username), password


def _error_fields(resp: requests.Response) -> tuple[str, str]:
    try:
        body = resp.json()
    except ValueError:
        return "error", resp.text[:200]
    if not isinstance(body, dict):
        return "error", str(body)[:200]
    return str(body.get("error", "error")), str(body.get("reason", ""))


def _require_id(doc: Doc) -> str:
    doc_id = doc.get("_id")
    if not isinstance(doc_id, str) or not doc_id:
        raise ValueError("the document needs a non-empty string _id")
    return doc_id


def _bulk_result(result: Doc) -> Saved | Conflict | Rejected:
    if "error" not in result:
        return Saved(result["id"], result["rev"])
    if result["error"] == "conflict":
        return Conflict(result["id"])
    return Rejected(result["id"], result["error"], str(result.get("reason", "")))


def _view_path(ddoc: str, view: str) -> str:
    ddoc = ddoc.removeprefix("_design/")
    return f"_design/{quote(ddoc, safe='')}/_view/{quote(view, safe='')}"


def _encode_params(params: Mapping[str, Any]) -> dict[str, str]:
    return {k: json.dumps(v) if k in _JSON_PARAMS else _plain_param(v) for k, v in params.items()}


def _plain_param(value: Any) -> str:
    # Strings go as they are (stale=ok, startkey_docid=x); the rest as JSON (true, 5).
    return value if isinstance(value, str) else json.dumps(value)


def _normalise_range(params: Mapping[str, Any]) -> dict[str, Any]:
    """The query with CouchDB's aliases folded and `key` turned into a range."""
    query = dict(params)
    for alias, name in (
        ("start_key", "startkey"),
        ("end_key", "endkey"),
        ("start_key_doc_id", "startkey_docid"),
        ("end_key_doc_id", "endkey_docid"),
    ):
        if alias in query:
            query[name] = query.pop(alias)
    if "key" in query:
        query["startkey"] = query["endkey"] = query.pop("key")
        query.pop("inclusive_end", None)
    return query


def _key_token(key: Any) -> str:
    # Compare keys as JSON: in Python True == 1, in CouchDB collation they differ.
    return json.dumps(key, sort_keys=True)


def _restart_at(
    query: dict[str, Any], row: Doc, by_docid: bool, run_length: int, run_key: str | None
) -> None:
    """Point `query` at `row`, the first row not yet yielded."""
    query["startkey"] = row.get("key")
    query.pop("skip", None)
    query.pop("startkey_docid", None)
    if by_docid and "id" in row:
        query["startkey_docid"] = row["id"]
    elif _key_token(row.get("key")) == run_key:
        query["skip"] = run_length  # rows with this key that were yielded already


def _continuous_items(chunks: Iterable[bytes]) -> Iterator[Doc]:
    """The JSON objects of a `feed=continuous` body: one per line, blank lines are heartbeats."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from (json.loads(line) for line in lines if line.strip())
    if pending.strip():
        yield json.loads(pending)


def _eventsource_items(chunks: Iterable[bytes]) -> Iterator[Doc]:
    """The JSON objects of a `feed=eventsource` body (CouchDB only)."""
    for event in sseclient.SSEClient(iter(chunks)).events():
        if event.event == "message":  # CouchDB's heartbeats are "heartbeat" events
            yield json.loads(event.data)


def _chunks(resp: requests.Response, should_stop: Callable[[], bool]) -> Iterator[bytes]:
    # chunk_size=None: each chunk as it arrives, so every heartbeat lets us check `stop`.
    for chunk in resp.iter_content(chunk_size=None):
        if should_stop():
            return
        yield chunk


def _change(item: Doc) -> Change:
    return Change(
        seq=item.get("seq"),
        id=item["id"],
        revs=[c["rev"] for c in item.get("changes", [])],
        deleted=bool(item.get("deleted", False)),
        doc=item.get("doc"),
    )


def _content(doc: Doc) -> Doc:
    return {k: v for k, v in doc.items() if k not in ("_rev", "_revisions", "_conflicts")}


def _with_rev(doc: Doc, current: Doc | None) -> Doc:
    return doc if current is None else doc | {"_rev": current["_rev"]}


def _replication_settings(doc: Doc) -> Doc:
    """The fields we write; the replicator's own (`_replication_*`, `owner`) do not count."""
    return {k: v for k, v in doc.items() if not k.startswith("_") and k not in _REPLICATOR_OWNED}
