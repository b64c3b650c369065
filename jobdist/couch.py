"""CouchDB access layer: one `Couch` per server, one `Database` per database.

Every call goes through IBM's Cloudant SDK (`ibmcloudant.CloudantV1`, set up in
couch_sdk.py). This is the thin layer above it that the rest of jobdist sees:
typed results (`Saved`, `Conflict`, `Rejected`), one error family (`CouchError`)
with one-line messages, retries bounded in time, and what the SDK cannot do for us
on both servers we support (leaf revisions, pouchdb-server's `_bulk_docs` order).
Credentials never appear in `url` attributes or in error messages. The `_changes`
feed is read in couch_changes.py, views are paged in couch_views.py, and design and
replication documents are written in couch_sync.py.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import requests
from ibm_cloud_sdk_core import ApiException, DetailedResponse
from ibmcloudant import CloudantV1
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from .couch_sdk import json_result, new_client, sdk_params, split_id
from .logs import EventLog
from .model import Doc, Leaf

# The 404 reasons meaning "no such database" rather than "no such document".
_NO_DB_REASONS = frozenset({"Database does not exist.", "no_db_file"})
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
_ERRORS_BY_STATUS: dict[int, type[CouchError]] = {404: NotFound, 401: Forbidden, 403: Forbidden}


_UNREACHABLE = (
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,
)


def _transient(error: BaseException) -> bool:
    """Worth another try: the server may be restarting, overloaded or briefly unreachable."""
    return isinstance(error, _UNREACHABLE) or (
        isinstance(error, ApiException) and error.status_code >= 500)


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
        site: str | None = None,
    ) -> None:
        """`site`: the site whose server this is, for the log (None: an operator's command)."""
        self.url, url_user, url_password = _split_credentials(url)
        self.site = site
        self.log = EventLog("jobdist.couch", site=site)
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

    def endpoint(self, address: str) -> Database:
        """A replication endpoint (database URL, or a name on this server) as a Database,
        with this server's timeouts and retries."""
        if "://" not in address:
            return self.database(address)
        base, _, name = address.rpartition("/")  # Couch takes the credentials out of `base`
        peer = Couch(base, timeout=self.timeout, retries=self.retries, retry_time=self.retry_time,
                     site=self.site)
        return peer.database(unquote(name))

    # -- the SDK underneath -------------------------------------------------------------

    def call(
        self,
        what: str,
        operation: Callable[..., DetailedResponse],
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """One SDK operation's result, retried on connection errors, timeouts and 5xx.

        Ours, not the SDK's `enable_retries`: urllib3's retries have no bound in
        time, and a daemon must give up within `retry_time` and decide again.
        4xx answers raise at once as the matching `CouchError`.
        """
        with self.errors(what):
            return json_result(self._retrying(what)(operation, *args, **kwargs).get_result())

    @contextmanager
    def errors(self, what: str) -> Iterator[None]:
        """Turn what the SDK and `requests` raise into one-line `CouchError`s."""
        try:
            yield
        except ApiException as exc:
            raise self._api_error(exc, what) from None
        except (json.JSONDecodeError, RecursionError) as exc:  # e.g. nested too deep for us
            raise Undecodable(self.clean(f"{what}: the answer is not JSON we can read: "
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
        return new_client(self.url, self.user, self._password, timeout)

    def _api_error(self, error: ApiException, what: str) -> CouchError:
        status = error.status_code
        if 200 <= status < 300:  # the SDK could not decode a successful answer
            return Undecodable(self.clean(f"{what}: the answer is not JSON we can read"))
        kind, reason = _error_fields(error.http_response)
        cls = _ERRORS_BY_STATUS.get(status, Unavailable if status >= 500 else CouchError)
        message = self.clean(f"{what} failed: HTTP {status} {kind}: {reason}")
        return cls(message, status=status, error=kind, reason=self.clean(reason))

    def _transport_error(self, exc: BaseException, what: str) -> CouchError:
        cls = Unavailable if isinstance(exc, _UNREACHABLE) else CouchError
        return cls(self.clean(f"{what} failed: {type(exc).__name__}: {str(exc)[:300]}"))

    def _retrying(self, what: str) -> Retrying:
        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            self.log.debug("retrying", request=what, attempt=state.attempt_number,
                           error=self.clean(repr(exc)))

        return Retrying(
            stop=stop_after_attempt(self.retries) | stop_after_delay(self.retry_time),
            wait=wait_exponential(multiplier=0.25, max=4),
            retry=retry_if_exception(_transient),
            before_sleep=before_sleep,
            reraise=True,
        )

    def clean(self, text: str) -> str:
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

    def call(self, what: str, operation: Callable[..., DetailedResponse], *args: Any,
             **kwargs: Any) -> Any:
        return self.couch.call(f"{what} in {self.url}", operation, self.name, *args, **kwargs)

    def info(self) -> Doc:
        return self.call("read database info", self.couch.client.get_database_information)

    def exists(self) -> bool:
        try:
            self.info()
        except NotFound:
            return False
        return True

    def last_seq(self) -> object:
        return self.info()["update_seq"]

    def security(self) -> Doc:
        return self.call("read _security", self.couch.client.get_security)

    def put_security(self, security: Doc) -> None:
        self.call("write _security", self.couch.client.put_security, **security)

    # -- documents ------------------------------------------------------------------

    def get(self, doc_id: str, *, conflicts: bool = False, rev: str | None = None) -> Doc | None:
        """The document (winning revision unless `rev`), or None when it does not exist."""
        client = self.couch.client
        kind, name = split_id(doc_id)
        operation = {"_design": client.get_design_document,
                     "_local": client.get_local_document}.get(kind, client.get_document)
        # A local document has no revisions to ask about.
        options: Doc = {} if kind == "_local" else {"conflicts": conflicts or None, "rev": rev}
        try:
            return self.call(f"get {doc_id!r}", operation, name, **options)
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
        `open_revs=all` (which the SDK lacks) would cost a request each.
        """
        wanted = list(dict.fromkeys(ids))
        found: dict[str, list[Doc]] = {}
        losers: list[Doc] = []
        for doc in self.bulk_get(wanted, conflicts=True):
            found[doc["_id"]] = [doc]
            losers += [{"id": doc["_id"], "rev": rev} for rev in doc.pop("_conflicts", [])]
        for start in range(0, len(losers), _BULK_GET_CHUNK):
            answer = self.call("read conflicting revisions", self.couch.client.post_bulk_get,
                               docs=losers[start : start + _BULK_GET_CHUNK])
            for result in answer["results"]:
                found[result["id"]] += [item["ok"] for item in result["docs"]
                                        if "ok" in item and not item["ok"].get("_deleted")]
        return {doc_id: found.get(doc_id, []) for doc_id in wanted}

    def save(self, doc: Leaf) -> SaveResult:
        """PUT one document (with `_rev` to update it). 409 gives Conflict; other errors raise."""
        doc_id = require_id(doc)
        client = self.couch.client
        kind, name = split_id(doc_id)
        operation = {"_design": client.put_design_document,
                     "_local": client.put_local_document}.get(kind, client.put_document)
        body = {"design_document" if kind == "_design" else "document": doc}
        return self._saved(doc_id, lambda: self.call(f"save {doc_id!r}", operation, name, **body))

    def delete(self, doc_id: str, rev: str) -> SaveResult:
        delete = self.couch.client.delete_document
        return self._saved(doc_id, lambda: self.call(f"delete {doc_id!r}", delete, doc_id,
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
        answer = self.call(what, self.couch.client.post_bulk_docs, {"docs": docs})
        by_id: dict[str, deque[Doc]] = defaultdict(deque)
        for result in answer:
            by_id[result.get("id", "")].append(result)
        results = []
        for doc in docs:
            if not by_id[doc["_id"]]:
                raise CouchError(self.couch.clean(f"{what} to {self.url}: "
                                                  f"no result for {doc['_id']!r}"))
            results.append(_bulk_result(by_id[doc["_id"]].popleft()))
        return results

    def bulk_get(self, ids: list[str], *, conflicts: bool = False) -> list[Doc]:
        """The current winning documents for those of `ids` that exist, in order."""
        docs: list[Doc] = []
        for start in range(0, len(ids), _BULK_GET_CHUNK):
            rows = self.call("read documents", self.couch.client.post_all_docs,
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

        self.write_until_saved(write, f"write {doc_id!r} to {self.url}")

    # -- views ----------------------------------------------------------------------

    def view(self, ddoc: str, view: str, **params: Any) -> list[Doc]:
        """The rows of a view query (CouchDB's parameter names, `startkey` or `start_key`)."""
        answer = self.call(f"query view {ddoc}/{view}", self.couch.client.post_view,
                           ddoc.removeprefix("_design/"), view, **sdk_params(params))
        return answer["rows"]

    def all_docs(self, **params: Any) -> list[Doc]:
        return self.call("list documents", self.couch.client.post_all_docs,
                         **sdk_params(params))["rows"]

    def view_cleanup(self) -> None:
        """Delete the index files of view versions no design document names any more.

        CouchDB keeps an index on disk after its design document changes until
        asked; the SDK has no call for `_view_cleanup`, so we send it ourselves.
        """
        client = self.couch.client

        def cleanup(name: str) -> DetailedResponse:
            return client.send(client.prepare_request(
                method="POST", url=f"/{quote(name, safe='')}/_view_cleanup",
                headers={"Accept": "application/json"}))

        self.call("clean up old view indexes", cleanup)

    # -- filters --------------------------------------------------------------------

    def require_filter(self, filter: str) -> None:
        """Raise NotFound unless this database has the filter function `ddoc/name`.

        pouchdb-server crashes on a missing filter (an unhandled rejection in
        node), so on it we check before any feed or replication uses one.
        """
        ddoc, _, name = filter.partition("/")
        design = self.get(f"_design/{ddoc}") if ddoc and name else None
        if design is None or name not in design.get("filters", {}):
            raise NotFound(
                self.couch.clean(f"filter {filter!r} does not exist in {self.url}"),
                status=404,
                error="not_found",
                reason="missing filter",
            )

    # -- helpers --------------------------------------------------------------------

    def write_until_saved(self, write: Callable[[], SaveResult | None], what: str) -> None:
        """Run read-decide-write `write` again after a Conflict; None means nothing to do."""
        for _ in range(_WRITE_ATTEMPTS):
            if not isinstance(write(), Conflict):
                return
        raise CouchError(
            self.couch.clean(f"{what} failed: still conflicting after {_WRITE_ATTEMPTS} tries"),
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


def require_id(doc: Leaf) -> str:
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
