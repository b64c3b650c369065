"""CouchDB access layer: one `Couch` per server, one `Database` per database.

Our client is IBM's Cloudant SDK (`ibmcloudant.CloudantV1` with its
`BasicAuthenticator`): every document, bulk, view, `_all_docs`, `_changes`,
`_local`, design, `_replicator`, `_security` and session call goes through it,
and `list_ids` pages `_all_docs` with its `Pagination`. This module is the thin
layer above it that the rest of jobdist sees: typed results (`Saved`,
`Conflict`, `Rejected`), one error family (`CouchError`) with one-line messages
that never show credentials, retries bounded in time, and what the SDK cannot
do for us on both servers we support:

* `_changes` sequences are strings on CouchDB and integers on pouchdb-server, so
  they are opaque values: never compared, only handed back as `since`.
* the daemon's feed is the SDK's `post_changes_as_stream` read line by line
  (continuous, or eventsource on Apache CouchDB): the SDK's `ChangesFollower`
  polls with `longpoll`, a request per batch, and converts every change into
  model objects; docs/performance.md has the measurement that kept ours.
* views page by `iter_view`, not by the SDK's view pager: that pager restarts a
  page at `start_key_doc_id`, which pouchdb-server ignores, so rows sharing a
  key (all the `involving` view's rows do) would repeat for ever.
* leaf revisions come from `_all_docs?conflicts=true` plus `_bulk_get`: the SDK
  has no `open_revs`.
* pouchdb-server returns `_bulk_docs` results out of order and `_local`
  documents without a JSON content type; both are coped with here.

Credentials never appear in `url` attributes or in error messages.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import requests
import sseclient
from ibm_cloud_sdk_core import ApiException, DetailedResponse
from ibm_cloud_sdk_core.authenticators import (
    Authenticator,
    BasicAuthenticator,
    NoAuthAuthenticator,
)
from ibmcloudant import CloudantV1, PagerType, Pagination
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from .model import Doc, Leaf

log = logging.getLogger("jobdist.couch")

# CouchDB's view parameter names as the SDK spells them.
_VIEW_PARAMS = {
    "startkey": "start_key",
    "endkey": "end_key",
    "startkey_docid": "start_key_doc_id",
    "endkey_docid": "end_key_doc_id",
}
# The 404 reasons meaning "no such database" rather than "no such document".
_NO_DB_REASONS = frozenset({"Database does not exist.", "no_db_file"})
# Fields the replicator itself adds to a replication document.
_REPLICATOR_OWNED = frozenset({"owner"})
_BULK_GET_CHUNK = 500
_WRITE_ATTEMPTS = 3
_ID_PAGE = 200  # the SDK's largest page


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

    def __init__(self, error: ApiException) -> None:
        super().__init__(error.code)
        self.error = error


# Worth another try: the server may be restarting, overloaded or briefly unreachable.
_UNREACHABLE = (
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,
)
_TRANSIENT = (*_UNREACHABLE, _ServerError)


class Couch:
    """One CouchDB server, through one `CloudantV1` client (and its `requests.Session`)."""

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
        self.user = user if user is not None else url_user
        self._password = password if password is not None else url_password
        self.timeout = timeout
        self.retries = retries
        self.retry_time = retry_time
        self.client = self._new_client((timeout, timeout))  # (connect, read)
        self._apache: bool | None = None

    def __repr__(self) -> str:
        return f"Couch({self.url!r})"

    def info(self) -> Doc:
        return self.call(f"read server info of {self.url}", self.client.get_server_information)

    def is_apache_couchdb(self) -> bool:
        # Cached: the answer decides protocol details on every feed and page.
        if self._apache is None:
            self._apache = "couchdb" in self.info()
        return self._apache

    def session_user(self) -> str | None:
        """The user this connection logs in as; None when anonymous or refused."""
        try:
            session = self.call(f"read the session at {self.url}",
                                self.client.get_session_information)
        except (Forbidden, NotFound):
            return None
        return session.get("userCtx", {}).get("name")

    def database(self, name: str) -> Database:
        return Database(self, name)

    def ensure_database(self, name: str) -> Database:
        db = self.database(name)
        try:
            self.call(f"create database {db.url}", self.client.put_database, name)
        except CouchError as error:
            if error.status != 412:  # 412: it exists already, which is all we want
                raise
        return db

    def replicator(self) -> Database:
        return self.ensure_database("_replicator")

    def put_replication(self, doc_id: str, source: str, target: str, **options: Any) -> bool:
        """`Database.put_replication` on this server's `_replicator` database."""
        return self.replicator().put_replication(doc_id, source, target, **options)

    # -- the SDK underneath -------------------------------------------------------------

    def call(
        self,
        what: str,
        operation: Callable[..., DetailedResponse],
        *args: Any,
        retry: bool = True,
        **kwargs: Any,
    ) -> Any:
        """One SDK operation's result, retried on connection errors, timeouts and 5xx.

        Ours, not the SDK's `enable_retries`: urllib3's retries have no bound in
        time, and a daemon must give up within `retry_time` and decide again.
        4xx answers raise at once as the matching `CouchError`.
        """

        def attempt() -> Any:
            try:
                return operation(*args, **kwargs).get_result()
            except ApiException as error:
                if error.status_code >= 500:
                    raise _ServerError(error) from None
                raise

        with self.errors(what):
            result = self._retrying(what)(attempt) if retry else attempt()
            return _json(result)

    @contextmanager
    def errors(self, what: str) -> Iterator[None]:
        """Turn what the SDK and `requests` raise into one-line `CouchError`s."""
        try:
            yield
        except _ServerError as exc:
            raise self._api_error(exc.error, what) from None
        except ApiException as exc:
            raise self._api_error(exc, what) from None
        except (json.JSONDecodeError, RecursionError) as exc:  # e.g. nested too deep for us
            raise Undecodable(self._clean(f"{what}: the answer is not JSON we can read: "
                                          f"{type(exc).__name__}")) from None
        except requests.RequestException as exc:
            raise self._transport_error(exc, what) from exc

    def stream_client(self, read_timeout: float) -> CloudantV1:
        """A client of its own for one long-lived stream, with a shorter read timeout.

        The SDK applies a client's timeout to every call (a per-call timeout is
        overridden), so a feed that must notice a dead connection within a few
        heartbeats needs a client of its own.
        """
        return self._new_client((self.timeout, read_timeout))

    def _new_client(self, timeout: tuple[float, float]) -> CloudantV1:
        client = CloudantV1(authenticator=self._authenticator())
        client.set_service_url(self.url)
        client.set_http_config({"timeout": timeout})
        session = client.get_http_client()
        _environment_once(session, self.url)
        # No gzip either way: a daemon's server is its site's own, a host or a rack
        # away. pouchdb-server deflated every larger answer (a tenth of its CPU under
        # a burst, with the replicator's, which asked too; CouchDB compresses none),
        # and the SDK gzips every request body, which the server then inflates.
        session.headers["Accept-Encoding"] = "identity"
        client.set_enable_gzip_compression(False)
        return client

    def _authenticator(self) -> Authenticator:
        if self.user is None:
            return NoAuthAuthenticator()
        # Basic rather than session (cookie) authentication: it survives a server
        # restart without a 401 and a new login in the middle of a decision.
        return BasicAuthenticator(self.user, self._password or "")

    def _api_error(self, error: ApiException, what: str) -> CouchError:
        status = error.status_code
        if 200 <= status < 300:  # the SDK could not decode a successful answer
            return Undecodable(self._clean(f"{what}: the answer is not JSON we can read"))
        kind, reason = _error_fields(error.http_response)
        cls: type[CouchError] = CouchError
        if status == 404:
            cls = NotFound
        elif status in (401, 403):
            cls = Forbidden
        elif status >= 500:
            cls = Unavailable
        message = self._clean(f"{what} failed: HTTP {status} {kind}: {reason}")
        return cls(message, status=status, error=kind, reason=self._clean(reason))

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

    def _call(self, what: str, operation: Callable[..., DetailedResponse], *args: Any,
              **kwargs: Any) -> Any:
        return self.couch.call(f"{what} in {self.url}", operation, self.name, *args, **kwargs)

    def info(self) -> Doc:
        return self._call("read database info", self.couch.client.get_database_information)

    def exists(self) -> bool:
        try:
            self.info()
        except NotFound:
            return False
        return True

    def last_seq(self) -> object:
        return self.info()["update_seq"]

    def security(self) -> Doc:
        return self._call("read _security", self.couch.client.get_security)

    def put_security(self, security: Doc) -> None:
        self._call("write _security", self.couch.client.put_security, **security)

    # -- documents ------------------------------------------------------------------

    def get(self, doc_id: str, *, conflicts: bool = False, rev: str | None = None) -> Doc | None:
        """The document (winning revision unless `rev`), or None when it does not exist."""
        client = self.couch.client
        kind, name = _split_id(doc_id)
        operation = {"_design": client.get_design_document,
                     "_local": client.get_local_document}.get(kind, client.get_document)
        # A local document has no revisions to ask about.
        options: Doc = {} if kind == "_local" else {"conflicts": conflicts or None, "rev": rev}
        try:
            return self._call(f"get {doc_id!r}", operation, name, **options)
        except NotFound as error:
            if error.reason in _NO_DB_REASONS:  # the database is missing: not hidden
                raise
            return None

    def leaves(self, doc_id: str) -> list[Doc]:
        """All live leaf revisions (the winner and its conflicts); [] when there is none."""
        return self.leaves_many([doc_id])[doc_id]

    def leaves_many(self, ids: Iterable[str]) -> dict[str, list[Doc]]:
        """The live leaf revisions of many documents, by id ([] for a missing or deleted one).

        One `_all_docs` request brings every winner with its `_conflicts`; one
        `_bulk_get` brings the losing leaves of the conflicted ones. Per document,
        `open_revs=all` would cost a request each.
        """
        wanted = list(dict.fromkeys(ids))
        found: dict[str, list[Doc]] = {}
        losers: list[Doc] = []
        for doc in self.bulk_get(wanted, conflicts=True):
            found[doc["_id"]] = [doc]
            losers += [{"id": doc["_id"], "rev": rev} for rev in doc.pop("_conflicts", [])]
        for start in range(0, len(losers), _BULK_GET_CHUNK):
            answer = self._call("read conflicting revisions", self.couch.client.post_bulk_get,
                                docs=losers[start : start + _BULK_GET_CHUNK])
            for result in answer["results"]:
                found[result["id"]] += [item["ok"] for item in result["docs"]
                                        if "ok" in item and not item["ok"].get("_deleted")]
        return {doc_id: found.get(doc_id, []) for doc_id in wanted}

    def save(self, doc: Leaf) -> SaveResult:
        """PUT one document (with `_rev` to update it). 409 gives Conflict; other errors raise."""
        doc_id = _require_id(doc)
        client = self.couch.client
        kind, name = _split_id(doc_id)
        if kind == "_design":
            operation, body = client.put_design_document, {"design_document": doc}
        elif kind == "_local":
            operation, body = client.put_local_document, {"document": doc}
        else:
            operation, body = client.put_document, {"document": doc}
        return self._saved(doc_id, lambda: self._call(f"save {doc_id!r}", operation, name, **body))

    def delete(self, doc_id: str, rev: str) -> SaveResult:
        delete = self.couch.client.delete_document
        return self._saved(doc_id, lambda: self._call(f"delete {doc_id!r}", delete, doc_id,
                                                      rev=rev))

    def _saved(self, doc_id: str, write: Callable[[], Doc]) -> SaveResult:
        try:
            body = write()
        except CouchError as error:
            if error.status == 409:
                return Conflict(doc_id)
            raise
        return Saved(body["id"], body["rev"])

    def bulk_docs(self, docs: Sequence[Leaf]) -> list[Saved | Conflict | Rejected]:
        """Write many documents; one result per input document, in input order.

        Documents without `_id` get a random one first: that makes a retried
        request harmless (it comes back as conflicts) and lets us match results
        by id, which we must since pouchdb-server does not keep input order.
        """
        docs = [doc if doc.get("_id") else {**doc, "_id": uuid.uuid4().hex} for doc in docs]
        if not docs:
            return []
        what = f"bulk write {len(docs)} documents"
        answer = self._call(what, self.couch.client.post_bulk_docs, {"docs": docs})
        by_id: dict[str, deque[Doc]] = defaultdict(deque)
        for result in answer:
            by_id[result.get("id", "")].append(result)
        results = []
        for doc in docs:
            if not by_id[doc["_id"]]:
                raise CouchError(self.couch._clean(f"{what} to {self.url}: "
                                                   f"no result for {doc['_id']!r}"))
            results.append(_bulk_result(by_id[doc["_id"]].popleft()))
        return results

    def bulk_get(self, ids: list[str], *, conflicts: bool = False) -> list[Doc]:
        """The current winning documents for those of `ids` that exist, in order."""
        docs: list[Doc] = []
        for start in range(0, len(ids), _BULK_GET_CHUNK):
            rows = self._call("read documents", self.couch.client.post_all_docs,
                              keys=ids[start : start + _BULK_GET_CHUNK], include_docs=True,
                              conflicts=conflicts or None)["rows"]
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
        """The rows of a view query (CouchDB's parameter names, `startkey` or `start_key`)."""
        answer = self._call(f"query view {ddoc}/{view}", self.couch.client.post_view,
                            ddoc.removeprefix("_design/"), view, **_sdk_params(params))
        return answer["rows"]

    def all_docs(self, **params: Any) -> list[Doc]:
        return self._call("list documents", self.couch.client.post_all_docs,
                          **_sdk_params(params))["rows"]

    def list_ids(self, start: str, end: str, page_size: int = _ID_PAGE) -> Iterator[str]:
        """The ids from `start` to `end`, paged by the SDK's `_all_docs` pager."""
        pages = Pagination.new_pagination(self.couch.client, PagerType.POST_ALL_DOCS,
                                          db=self.name, start_key=start, end_key=end,
                                          limit=min(page_size, _ID_PAGE))
        rows = iter(pages.rows())
        while True:
            with self.couch.errors(f"list documents in {self.url}"):
                row = next(rows, None)
            if row is None:
                return
            yield row.id

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
        conflicts: bool = False,
        feed: str = "auto",
        heartbeat_ms: int = 10000,
        filter: str | None = None,
        stop: threading.Event | None = None,
        timeout: float | None = None,
        style: str = "main_only",
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
        options: Doc = {
            "since": since if isinstance(since, str) else json.dumps(since),
            "include_docs": include_docs,
            "conflicts": conflicts or None,
            "style": style,
        }
        if filter is not None:
            if not filter.startswith("_") and not self.couch.is_apache_couchdb():
                self.require_filter(filter)
            options["filter"] = filter
        if feed == "normal":
            return self._changes_batch(options)
        if feed not in ("continuous", "eventsource"):
            raise ValueError(f"unknown changes feed {feed!r}")
        options |= {"feed": feed, "heartbeat": heartbeat_ms}
        return self._changes_stream(options, heartbeat_ms / 1000, stop, timeout)

    def _changes_batch(self, options: Doc) -> Iterator[Change]:
        body = self._call("read changes", self.couch.client.post_changes, **options)
        return iter([_change(item) for item in body["results"]])

    def _changes_stream(
        self,
        options: Doc,
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

        # A read timeout a little above the heartbeat notices a dead connection;
        # identity encoding because a gzipped stream is buffered by the server.
        client = self.couch.stream_client(heartbeat * 1.5 + 1.0)
        with self.couch.errors(what):
            resp = client.post_changes_as_stream(
                self.name, headers={"Accept-Encoding": "identity"}, **options).get_result()
        with resp, self.couch.errors(what):
            parse = _eventsource_items if options["feed"] == "eventsource" else _continuous_items
            try:
                for item in parse(_chunks(resp, should_stop)):
                    if should_stop() or "id" not in item:  # {"last_seq": ...} ends the feed
                        return
                    yield _change(item)
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


def _error_fields(resp: requests.Response | None) -> tuple[str, str]:
    if resp is None:
        return "error", ""
    try:
        body = resp.json()
    except ValueError:
        return "error", resp.text[:200]
    if not isinstance(body, dict):
        return "error", str(body)[:200]
    return str(body.get("error", "error")), str(body.get("reason", ""))


def _environment_once(session: requests.Session, url: str) -> None:
    """Read the proxy and CA settings from the environment now, not at every request.

    `requests` scans the environment for them on each call: about a quarter of
    its CPU per request to a local server, on the daemon's hot path.
    """
    session.proxies.update(requests.utils.get_environ_proxies(url))
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if bundle:
        session.verify = bundle
    session.trust_env = False


def _json(result: Any) -> Any:
    # pouchdb-server sends `_local` documents without a JSON content type, so the
    # SDK hands back the response itself.
    return result.json() if isinstance(result, requests.Response) else result


def _split_id(doc_id: str) -> tuple[str, str]:
    """("_design" | "_local" | "", the name the SDK's call for that kind wants)."""
    for kind in ("_design", "_local"):
        if doc_id.startswith(kind + "/"):
            return kind, doc_id[len(kind) + 1 :]
    return "", doc_id


def _sdk_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """View and `_all_docs` parameters under the SDK's names (`startkey` → `start_key`)."""
    return {_VIEW_PARAMS.get(name, name): value for name, value in params.items()}


def _require_id(doc: Leaf) -> str:
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
