"""The daemon's admin HTTP endpoint: status, metrics and control at run time (thesis 7.2).

    GET  /status     JSON: site, workers, running steps, feed position, held results,
                     uptime, memory, counts
    GET  /metrics    Prometheus text format
    POST /workers    {"size": N}    resize the worker pool (running steps are never killed)
    POST /keepalive  {"period": S}  change the keep-alive period
    GET  /, /jobs, /jobs/<id>, /events; POST /jobs/<id>/cancel   the dashboard
                     (jobdist/dashboard.py)

Bound to 127.0.0.1 unless configured. Every POST needs `Authorization: Bearer
TOKEN` with the configured token; with no token configured, writes are refused:
the endpoint is never open for writing. A POST a browser says came from another
site is refused before the token is looked at. The standard library's threading HTTP
server in a daemon thread is enough for an operator's handful of requests.

Handlers only read the daemon's state (the pool locks, the counts are copied
in one C call) or use thread-safe calls (WorkerPool.resize, an attribute the
keep-alive thread reads each pass); they never run the manager's decisions.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import socket
import threading
from collections.abc import Callable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from .client import site_database
from .config import ConfigError, SiteConfig
from .couch import Couch, CouchError, Database
from .dashboard import Dashboard, Refused, Reply, same_origin
from .hub import ChangeHub
from .listener import feed_lag

log = logging.getLogger("jobdist.admin")

MAX_BODY = 64 * 1024
MAX_WORKERS = 1024
MAX_KEEPALIVE_PERIOD = 24 * 3600.0

# Manager counts exposed as counters: metric name (without _total), count, help.
COUNTERS = (
    ("steps_started", "steps_started", "Steps this site started on a worker."),
    ("steps_finished", "steps_finished", "Steps this site ran to success."),
    ("steps_failed", "steps_failed", "Steps this site ran that failed."),
    ("claims_made", "action_claim", "Claims this site wrote for open steps."),
    ("claims_won", "claims_won", "Claims of this site that the creator assigned to it."),
    ("claims_lost", "action_free", "Bookings freed because the step no longer needs them "
                                   "(another site won, or the job moved on)."),
    ("conflicts_resolved", "conflicts_resolved", "Losing revisions this site deleted."),
    ("write_conflicts", "write_conflicts", "Writes refused with 409 and decided again."),
    ("launches_stopped", "launches_stopped", "Steps launched ahead of their start whose start "
                                             "could not be written, stopped."),
    ("starts_deferred", "starts_deferred", "Steps launched with their start's write "
                                           "deferred (tuning.start_write_delay)."),
    ("decided_while_writing", "decided_while_writing", "Worker reports, and the next work "
                                                       "of the workers they freed, decided "
                                                       "while a write was in flight."),
    ("invalid_documents", "invalid_documents", "Job revisions skipped as invalid."),
    ("writes_refused", "writes_refused", "Writes CouchDB refused (403), e.g. a job past the "
                                         "size limit."),
    ("jobs_skipped", "jobs_skipped", "Jobs passed by until they change: invalid, unreadable "
                                     "or refused."),
    ("results_held", "results_held", "Step results kept in the journal because CouchDB did "
                                     "not take them."),
    ("results_replayed", "results_replayed", "Held step results written once CouchDB took "
                                             "them."),
    ("journal_errors", "journal_errors", "Held results the journal could not keep on disk."),
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


class Site(Protocol):
    """What the admin endpoint needs of a daemon (jobdist/daemon.py's Daemon)."""

    config: SiteConfig
    db: Database
    changes: ChangeHub

    @property
    def known_sites(self) -> frozenset[str]: ...

    def status(self) -> dict[str, Any]: ...

    def resize_workers(self, size: int) -> dict[str, int]: ...

    def set_keepalive_period(self, period: float) -> float: ...


class SiteCollector(Collector):
    """Prometheus metrics read from the daemon's live state at each scrape."""

    def __init__(self, daemon: Site, couch: Couch) -> None:
        self.daemon = daemon
        self.couch = couch  # short timeout, no retries: a scrape must stay quick

    def collect(self) -> Iterator[Metric]:
        site = self.daemon.config.name
        status = self.daemon.status()
        counts = status["counts"]
        for name, key, doc in COUNTERS:
            yield _counter(f"jobdist_{name}", doc, site, counts.get(key, 0))
        yield _counter("jobdist_keepalive_resaves", "Jobs the keep-alive re-saved.", site,
                       status["keepalive_resaves"])
        yield _counter("jobdist_feed_reconnects", "Times the changes feed was reconnected.",
                       site, status["feed"]["reconnects"])
        actions = CounterMetricFamily("jobdist_decisions", "Decisions carried out, by action.",
                                      labels=["site", "action"])
        for key, value in sorted(counts.items()):
            if key.startswith("action_"):
                actions.add_metric([site, key.removeprefix("action_")], value)
        yield actions
        yield from self._workers(site, status["workers"])
        yield from self._feed(site, status["feed"])
        journal = status["journal"]
        yield _gauge("jobdist_results_held", "Step results waiting in the journal for CouchDB.",
                     site, journal["held"])
        yield _gauge("jobdist_results_held_oldest_seconds", "Age of the oldest held result "
                     "(0 when none).", site, journal["oldest_seconds"] or 0)
        yield _gauge("jobdist_keepalive_period_seconds", "Seconds between keep-alive passes.",
                     site, status["keepalive_period"])
        yield _gauge("jobdist_keepalive_left_for_room", "Stale open jobs the last keep-alive "
                     "pass left in line: no site had a free worker to start them.", site,
                     status["keepalive_left_for_room"])
        yield _gauge("jobdist_uptime_seconds", "Seconds since the daemon started.", site,
                     status["uptime_seconds"])

    def _workers(self, site: str, workers: dict[str, int]) -> Iterator[Metric]:
        by_state = GaugeMetricFamily("jobdist_workers", "Worker slots by state.",
                                     labels=["site", "state"])
        for state in ("free", "booked", "busy"):
            by_state.add_metric([site, state], workers[state])
        yield by_state
        yield _gauge("jobdist_workers_size", "Worker slots the pool should have.", site,
                     workers["size"])

    def _feed(self, site: str, feed: dict[str, Any]) -> Iterator[Metric]:
        yield _gauge("jobdist_feed_queued", "Changes received but not yet decided on.", site,
                     feed["queued"])
        try:
            update_seq = self.couch.database(self.daemon.db.name).last_seq()
        except CouchError:
            update_seq = None
        yield _gauge("jobdist_couch_up", "1 when the site's CouchDB answered this scrape.",
                     site, 0 if update_seq is None else 1)
        lag = feed_lag(update_seq, feed["received"])
        if lag is not None:
            yield _gauge("jobdist_feed_lag", "Changes in the database the feed has not "
                         "delivered yet (approximate on clustered CouchDB).", site, lag)


def _counter(name: str, documentation: str, site: str, value: float) -> Metric:
    family = CounterMetricFamily(name, documentation, labels=["site"])
    family.add_metric([site], value)
    return family


def _gauge(name: str, documentation: str, site: str, value: float) -> Metric:
    family = GaugeMetricFamily(name, documentation, labels=["site"])
    family.add_metric([site], value)
    return family


# --- requests -----------------------------------------------------------------------


class RequestError(Exception):
    """A request we refuse: the status and one clear message for the client."""

    def __init__(self, status: HTTPStatus, message: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


def parse_body(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"the body is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise RequestError(HTTPStatus.BAD_REQUEST, "the body must be a JSON object")
    return value


def worker_count(body: dict[str, Any]) -> int:
    size = body.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_WORKERS:
        raise RequestError(HTTPStatus.BAD_REQUEST,
                           f'"size" must be an integer from 0 to {MAX_WORKERS}, e.g. {{"size": 4}}')
    return size


def keepalive_period(body: dict[str, Any]) -> float:
    period = body.get("period")
    if isinstance(period, bool) or not isinstance(period, int | float) or not (
            math.isfinite(period) and 0 < period <= MAX_KEEPALIVE_PERIOD):
        raise RequestError(HTTPStatus.BAD_REQUEST,
                           f'"period" must be a number of seconds above 0 and at most '
                           f'{MAX_KEEPALIVE_PERIOD:.0f}, e.g. {{"period": 5}}')
    return float(period)


class AdminHandler(BaseHTTPRequestHandler):
    server: _HttpServer

    def version_string(self) -> str:
        return "jobdist-admin"

    def do_GET(self) -> None:
        if self._path() == "/events":
            self._serve("GET", lambda admin, body: admin.dashboard.stream_events(self))
            return
        query = dict(parse_qsl(urlsplit(self.path).query))
        self._serve("GET", lambda admin, body: admin.get(self._path(), query, self.headers))

    def do_POST(self) -> None:
        self._serve("POST", lambda admin, body: admin.post(self._path(), self.headers, body))

    def _serve(self, method: str,
               action: Callable[[AdminServer, bytes | None], Reply | None]) -> None:
        admin = self.server.admin
        try:
            body = self._read_body() if method == "POST" else b""
            reply = action(admin, body)
            if reply is not None:  # None: a stream, already answered
                self._send(reply.status, reply.content_type, reply.body, reply.headers)
        except Refused as error:
            self._send(error.status, "application/json", _json({"error": str(error)}))
        except RequestError as error:
            self._send(error.status, "application/json",
                       _json({"error": str(error)}), error.headers)
        except Exception:
            log.exception("admin request failed site=%s %s %s", admin.site, method, self.path)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, "application/json",
                       _json({"error": "internal error; see the daemon's log"}))

    def _path(self) -> str:
        return urlsplit(self.path).path.rstrip("/") or "/"

    def _read_body(self) -> bytes | None:
        """The request body, or None when it is larger than we accept (never read then)."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise RequestError(HTTPStatus.BAD_REQUEST, "bad Content-Length") from None
        if length > MAX_BODY:
            return None
        return self.rfile.read(max(0, length))

    def _send(self, status: HTTPStatus, content_type: str, payload: bytes,
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def start_stream(self, headers: dict[str, str]) -> None:
        """Answer 200 with no length: what follows is written as it comes."""
        self.connection.settimeout(30.0)  # a client that stops reading is dropped
        self.send_response(HTTPStatus.OK)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.flush()

    def write_chunk(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:
        # One line per request, at DEBUG: the writes themselves are logged at INFO.
        log.debug("admin request site=%s client=%s %s", self.server.admin.site,
                  self.client_address[0], format % args)


class _HttpServer(ThreadingHTTPServer):
    admin: AdminServer


class _HttpServer6(_HttpServer):
    address_family = socket.AF_INET6


def _json(value: Any) -> bytes:
    return json.dumps(value, default=str).encode() + b"\n"


# --- the server -----------------------------------------------------------------------


class AdminServer:
    """One daemon's admin endpoint; `start` binds (port 0: any free port), `stop` closes."""

    def __init__(self, daemon: Site, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None) -> None:
        self.daemon = daemon
        self.site = daemon.config.name
        self.host = host
        self.requested_port = port
        self._token = token.encode() if token else None
        self.registry = CollectorRegistry(auto_describe=False)  # per server: nothing global
        config = daemon.config
        couch = Couch(config.couch.url, user=config.couch.user, password=config.couch.password,
                      timeout=2.0, retries=1)
        self.registry.register(SiteCollector(daemon, couch))
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, CPU, fds
        self.dashboard = Dashboard(config, daemon.known_sites, daemon.changes,
                                   site_database(config, quick=True), daemon.status,
                                   writes=self._token is not None)
        self._http: _HttpServer | None = None
        self._thread: threading.Thread | None = None

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
        self._thread = threading.Thread(target=self._http.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name=f"admin-{self.site}", daemon=True)
        self._thread.start()
        log.info("admin endpoint listening site=%s url=%s writes=%s", self.site, self.url,
                 "token" if self._token else "refused (no token configured)")

    def stop(self) -> None:
        if self._http is None:
            return
        self.dashboard.close()
        self._http.shutdown()
        self._http.server_close()
        if self._thread is not None:
            self._thread.join(5.0)
        self._http = None
        log.info("admin endpoint stopped site=%s", self.site)

    # -- routes --

    def get(self, path: str, query: dict[str, str], headers: Any) -> Reply:
        if path == "/status":
            return Reply("application/json", _json(self.daemon.status()))
        if path == "/metrics":
            return Reply(CONTENT_TYPE_LATEST, generate_latest(self.registry))
        if self.dashboard.handles(path):
            return self.dashboard.get(path, query, self.authorized(headers))
        raise self._unknown(path, "GET")

    def post(self, path: str, headers: Any, body: bytes | None) -> Reply:
        dashboard = self.dashboard.handles(path)
        if path not in ("/workers", "/keepalive") and not dashboard:
            raise self._unknown(path, "POST")
        if not same_origin(headers):
            raise RequestError(HTTPStatus.FORBIDDEN, "cross-site request refused")
        self.authorize(headers.get("Authorization"))
        if dashboard:
            return self.dashboard.post(path)
        if body is None:
            raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                               f"the body is larger than {MAX_BODY} bytes")
        fields = parse_body(body)
        if path == "/workers":
            return Reply("application/json", _json(self.resize_workers(worker_count(fields))))
        return Reply("application/json",
                     _json(self.set_keepalive_period(keepalive_period(fields))))

    def authorized(self, headers: Any) -> bool:
        """Whether a GET may show actions: False without a token; a wrong one is refused."""
        if not headers.get("Authorization") or self._token is None:
            return False
        self.authorize(headers.get("Authorization"))
        return True

    def authorize(self, header: str | None) -> None:
        if self._token is None:
            raise RequestError(HTTPStatus.FORBIDDEN,
                               "writes are disabled: this daemon has no admin token configured "
                               "([admin] token_file, token or $JOBDIST_ADMIN_TOKEN)")
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise RequestError(HTTPStatus.UNAUTHORIZED,
                               "missing token: send the header 'Authorization: Bearer TOKEN'",
                               {"WWW-Authenticate": 'Bearer realm="jobdist"'})
        if not hmac.compare_digest(given.strip().encode(), self._token):
            raise RequestError(HTTPStatus.FORBIDDEN, "wrong token")

    def resize_workers(self, size: int) -> dict[str, Any]:
        workers = self.daemon.resize_workers(size)
        log.info("admin resized workers site=%s size=%d", self.site, workers["size"])
        return {"workers": workers}

    def set_keepalive_period(self, period: float) -> dict[str, Any]:
        before = self.daemon.set_keepalive_period(period)
        log.info("admin changed keep-alive period site=%s period=%.3gs->%.3gs",
                 self.site, before, period)
        return {"keepalive_period": period}

    def _unknown(self, path: str, method: str) -> RequestError:
        allowed = {"/status": "GET", "/metrics": "GET", "/workers": "POST", "/keepalive": "POST",
                   "/events": "GET"}
        if path in allowed:
            return RequestError(HTTPStatus.METHOD_NOT_ALLOWED,
                                f"{method} {path} is not supported; use {allowed[path]}",
                                {"Allow": allowed[path]})
        return RequestError(HTTPStatus.NOT_FOUND,
                            f"no such endpoint {path}; there are GET /status, GET /metrics, "
                            "POST /workers, POST /keepalive and the dashboard at GET /")

