"""The daemon's admin HTTP endpoint: status, metrics, control and the dashboard at run
time (thesis 7.2; docs/operations.md describes each endpoint).

Every route is a row of one table, `AdminServer.routes`. Bound to 127.0.0.1
unless configured. Reading is open; a POST needs the admin token (`authorized`),
so with none configured the endpoint is never open for writing. The standard
library's threading HTTP server is enough for an operator's handful of requests.

Handlers only read the daemon's state (the pool locks, the counts are copied
in one C call) or use thread-safe calls (WorkerPool.resize, an attribute the
keep-alive thread reads each pass); they never run the manager's decisions.
"""

from __future__ import annotations

import hmac
import json
import math
import re
import socket
import threading
from collections.abc import Callable, Iterator
from email.message import Message
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from .client import site_database
from .config import ConfigError
from .couch import CouchError, Database
from .dashboard import Dashboard, Handler, Refused, Reply, Request, Route, json_reply
from .listener import feed_lag
from .logs import EventLog

if TYPE_CHECKING:
    from .daemon import Daemon

MAX_BODY = 64 * 1024
MAX_WORKERS = 1024
MAX_KEEPALIVE_PERIOD = 24 * 3600.0
HEADERS = {  # on every answer
    # Only this endpoint's own script and styles run: an injected tag could do nothing.
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self'; connect-src 'self'; form-action 'self'; "
                               "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

# The metrics, each read at a path of GET /status's answer (0 when absent or null):
# name (without jobdist_, nor _total for counters), path, help.
COUNTERS = (
    ("steps_started", "counts.steps_started", "Steps this site started on a worker."),
    ("steps_finished", "counts.steps_finished", "Steps this site ran to success."),
    ("steps_failed", "counts.steps_failed", "Steps this site ran that failed."),
    ("claims_made", "counts.action_claim", "Claims this site wrote for open steps."),
    ("claims_won", "counts.claims_won", "Claims of this site that the creator assigned to it."),
    ("claims_lost", "counts.action_free", "Bookings freed because the step no longer needs "
     "them (another site won, or the job moved on)."),
    ("conflicts_resolved", "counts.conflicts_resolved", "Losing revisions this site deleted."),
    ("write_conflicts", "counts.write_conflicts", "Writes refused with 409 and decided again."),
    ("launches_stopped", "counts.launches_stopped", "Steps launched ahead of their start "
     "whose start could not be written, stopped."),
    ("starts_deferred", "counts.starts_deferred", "Steps launched with their start's write "
     "deferred (tuning.start_write_delay)."),
    ("decided_while_writing", "counts.decided_while_writing", "Worker reports, and the next "
     "work of the workers they freed, decided while a write was in flight."),
    ("invalid_documents", "counts.invalid_documents", "Job revisions skipped as invalid."),
    ("writes_refused", "counts.writes_refused", "Writes CouchDB refused (403), e.g. a job "
     "past the size limit."),
    ("jobs_skipped", "counts.jobs_skipped", "Jobs passed by until they change: invalid, "
     "unreadable or refused."),
    ("results_held", "counts.results_held", "Step results kept in the journal because "
     "CouchDB did not take them."),
    ("results_replayed", "counts.results_replayed", "Held step results written once CouchDB "
     "took them."),
    ("journal_errors", "counts.journal_errors", "Held results the journal could not keep on "
     "disk."),
    ("keepalive_resaves", "keepalive_resaves", "Jobs the keep-alive re-saved."),
    ("feed_reconnects", "feed.reconnects", "Times the changes feed was reconnected."),
)
GAUGES = (
    ("workers_size", "workers.size", "Worker slots the pool should have."),
    ("feed_queued", "feed.queued", "Changes received but not yet decided on."),
    ("results_held", "journal.held", "Step results waiting in the journal for CouchDB."),
    ("results_held_oldest_seconds", "journal.oldest_seconds", "Age of the oldest held "
     "result (0 when none)."),
    ("keepalive_period_seconds", "keepalive_period", "Seconds between keep-alive passes."),
    ("keepalive_left_for_room", "keepalive_left_for_room", "Stale open jobs the last "
     "keep-alive pass left in line: no site had a free worker to start them."),
    ("uptime_seconds", "uptime_seconds", "Seconds since the daemon started."),
)

# --- what the endpoint reports ------------------------------------------------------


def resident_memory_bytes(status_file: Path = Path("/proc/self/status")) -> int | None:
    """VmRSS of this process in bytes, or None where /proc does not say."""
    try:
        for line in status_file.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024  # the kernel reports kB
    except (OSError, ValueError, IndexError):
        return None
    return None


class SiteCollector(Collector):
    """Prometheus metrics read from the daemon's live state at each scrape."""

    def __init__(self, daemon: Daemon, db: Database) -> None:
        self.daemon = daemon
        self.db = db  # short timeout, few retries: a scrape must stay quick

    def collect(self) -> Iterator[Metric]:
        site = self.daemon.config.name
        status = self.daemon.status()
        for family, table in ((CounterMetricFamily, COUNTERS), (GaugeMetricFamily, GAUGES)):
            for name, path, documentation in table:
                yield _metric(family, name, documentation, site, value_at(status, path))
        actions = CounterMetricFamily("jobdist_decisions", "Decisions carried out, by action.",
                                      labels=["site", "action"])
        for key, value in sorted(status["counts"].items()):
            if key.startswith("action_"):
                actions.add_metric([site, key.removeprefix("action_")], value)
        yield actions
        workers = GaugeMetricFamily("jobdist_workers", "Worker slots by state.",
                                    labels=["site", "state"])
        for state in ("free", "booked", "busy"):
            workers.add_metric([site, state], status["workers"][state])
        yield workers
        try:
            update_seq = self.db.last_seq()
        except CouchError:
            update_seq = None
        yield _metric(GaugeMetricFamily, "couch_up", "1 when the site's CouchDB answered this "
                      "scrape.", site, 0 if update_seq is None else 1)
        lag = feed_lag(update_seq, status["feed"]["received"])
        if lag is not None:
            yield _metric(GaugeMetricFamily, "feed_lag", "Changes in the database the feed "
                          "has not delivered yet (approximate on clustered CouchDB).", site, lag)


def value_at(status: dict[str, Any], path: str) -> float:
    value: Any = status
    for key in path.split("."):
        value = value.get(key)
    return value or 0


def _metric(family: type[CounterMetricFamily | GaugeMetricFamily], name: str,
            documentation: str, site: str, value: float) -> Metric:
    metric = family(f"jobdist_{name}", documentation, labels=["site"])
    metric.add_metric([site], value)
    return metric


# --- requests -----------------------------------------------------------------------


def body_field(body: bytes, name: str, valid: Callable[[Any], bool], expected: str) -> Any:
    """Field `name` of a JSON object body; a 400 saying what is expected otherwise."""
    try:
        fields = json.loads(body)
    except ValueError as error:  # (a UnicodeDecodeError is one too)
        raise Refused(HTTPStatus.BAD_REQUEST, f"the body is not JSON: {error}") from None
    if not isinstance(fields, dict):
        raise Refused(HTTPStatus.BAD_REQUEST, "the body must be a JSON object")
    value = fields.get(name)
    if isinstance(value, bool) or not valid(value):  # (True is an int to Python)
        raise Refused(HTTPStatus.BAD_REQUEST, f'"{name}" must be {expected}')
    return value


def same_origin(headers: Message) -> bool:
    """False for a request a browser says came from another site (CSRF); requests
    without these headers (curl, the CLI) are not from a browser page at all."""
    if headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = headers.get("Origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == headers.get("Host", "")


class AdminHandler(BaseHTTPRequestHandler):
    server: _HttpServer

    def version_string(self) -> str:
        return "jobdist-admin"

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        admin = self.server.admin
        try:
            url = urlsplit(self.path)
            handle, param = admin.route(method, url.path.rstrip("/") or "/")
            authorized = admin.authorized(method, self.headers)
            body = self._read_body() if method == "POST" else b""
            reply = handle(Request(param, dict(parse_qsl(url.query)), body, authorized))
            self._send(reply)
        except Refused as error:
            self._send(json_reply({"error": str(error)}, error.status, error.headers))
        except Exception:
            admin.log.exception("admin request failed", method=method, path=self.path)
            self._send(json_reply({"error": "internal error; see the daemon's log"},
                                  HTTPStatus.INTERNAL_SERVER_ERROR))

    def _read_body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise Refused(HTTPStatus.BAD_REQUEST, "bad Content-Length") from None
        if length > MAX_BODY:  # refused unread
            raise Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                          f"the body is larger than {MAX_BODY} bytes")
        return self.rfile.read(max(0, length))

    def _send(self, reply: Reply) -> None:
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            if reply.stream is None:
                self.send_header("Content-Length", str(len(reply.body)))
            for name, value in {**HEADERS, **reply.headers}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(reply.body)  # (unbuffered: each write is sent at once)
            if reply.stream is not None:
                self.connection.settimeout(30.0)  # a client that stops reading is dropped
                for chunk in reply.stream:
                    self.wfile.write(chunk)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the client went away
        finally:
            if reply.stream is not None:
                reply.stream.close()

    def log_message(self, format: str, *args: Any) -> None:
        # One line per request, at DEBUG: the writes themselves are logged at INFO.
        self.server.admin.log.debug("admin request", client=self.client_address[0],
                                    request=format % args)


class _HttpServer(ThreadingHTTPServer):
    admin: AdminServer


class _HttpServer6(_HttpServer):
    address_family = socket.AF_INET6


# --- the server -----------------------------------------------------------------------


class AdminServer:
    """One daemon's admin endpoint; `start` binds (port 0: any free port), `stop` closes."""

    def __init__(self, daemon: Daemon, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None) -> None:
        self.daemon = daemon
        self.site = daemon.config.name
        self.log = EventLog("jobdist.admin", site=self.site)
        self.host = host
        self.requested_port = port
        self._token = token.encode() if token else None
        db = site_database(daemon.config, quick=True)  # a page or a scrape must not hang
        self.registry = CollectorRegistry(auto_describe=False)  # per server: nothing global
        self.registry.register(SiteCollector(daemon, db))
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, CPU, fds
        self.dashboard = Dashboard(daemon.config, daemon.known_sites, daemon.changes, db,
                                   daemon.status, writes=self._token is not None)
        self.routes: list[Route] = [
            ("GET", "/status", lambda request: json_reply(daemon.status())),
            ("GET", "/metrics",
             lambda request: Reply(CONTENT_TYPE_LATEST, generate_latest(self.registry))),
            ("POST", "/workers", self.resize_workers),
            ("POST", "/keepalive", self.set_keepalive_period),
            *self.dashboard.routes(),
        ]
        self._http: _HttpServer | None = None

    @property
    def port(self) -> int:
        if self._http is None:
            raise RuntimeError("the admin endpoint is not started")
        return self._http.server_address[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        server_class = _HttpServer6 if ":" in self.host else _HttpServer
        try:
            self._http = server_class((self.host, self.requested_port), AdminHandler)
        except OSError as error:
            raise ConfigError(f"admin endpoint: cannot listen on {self.host}:"
                              f"{self.requested_port}: {error.strerror or error}") from None
        self._http.admin = self
        threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.2},
                         name=f"admin-{self.site}", daemon=True).start()
        self.log.info("admin endpoint listening", url=self.url,
                      writes="token" if self._token else "refused (no token configured)")

    def stop(self) -> None:
        if self._http is None:
            return
        self.dashboard.close()
        self._http.shutdown()  # returns once serve_forever has
        self._http.server_close()
        self._http = None
        self.log.info("admin endpoint stopped")

    def route(self, method: str, path: str) -> tuple[Handler, str]:
        """The handler of a request and what its route's pattern took from the path."""
        allowed = []
        for verb, pattern, handle in self.routes:
            if found := re.fullmatch(pattern, path):
                if verb == method:
                    return handle, unquote(found[1]) if found.groups() else ""
                allowed.append(verb)
        if allowed:
            raise Refused(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} {path} is not supported; "
                          f"use {', '.join(allowed)}", {"Allow": ", ".join(allowed)})
        raise Refused(HTTPStatus.NOT_FOUND,
                      f"no such endpoint {path}; there are GET /status, GET /metrics, "
                      "POST /workers, POST /keepalive and the dashboard at GET /")

    def authorized(self, method: str, headers: Message) -> bool:
        """Whether the request carries the token. A POST must (and, from a browser, come
        from this endpoint's own pages); a GET may, to see the dashboard's actions."""
        header = headers.get("Authorization")
        if method == "GET":
            if not header or self._token is None:
                return False
        elif not same_origin(headers):
            raise Refused(HTTPStatus.FORBIDDEN, "cross-site request refused")
        elif self._token is None:
            raise Refused(HTTPStatus.FORBIDDEN,
                          "writes are disabled: this daemon has no admin token configured "
                          "([admin] token_file, token or $JOBDIST_ADMIN_TOKEN)")
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise Refused(HTTPStatus.UNAUTHORIZED,
                          "missing token: send the header 'Authorization: Bearer TOKEN'",
                          {"WWW-Authenticate": 'Bearer realm="jobdist"'})
        if not hmac.compare_digest(given.strip().encode(), self._token):
            raise Refused(HTTPStatus.FORBIDDEN, "wrong token")
        return True

    def resize_workers(self, request: Request) -> Reply:
        size = body_field(request.body, "size",
                          lambda size: isinstance(size, int) and 0 <= size <= MAX_WORKERS,
                          f'an integer from 0 to {MAX_WORKERS}, e.g. {{"size": 4}}')
        workers = self.daemon.resize_workers(size)
        self.log.info("admin resized workers", size=workers["size"])
        return json_reply({"workers": workers})

    def set_keepalive_period(self, request: Request) -> Reply:
        period = float(body_field(
            request.body, "period", lambda period: isinstance(period, int | float)
            and math.isfinite(period) and 0 < period <= MAX_KEEPALIVE_PERIOD,
            f"a number of seconds above 0 and at most {MAX_KEEPALIVE_PERIOD:.0f}, "
            'e.g. {"period": 5}'))
        before = self.daemon.set_keepalive_period(period)
        self.log.info("admin changed keep-alive period", period=period, before=before)
        return json_reply({"keepalive_period": period})
