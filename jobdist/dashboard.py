"""The dashboard each daemon serves beside /status and /metrics: its routes join the
admin endpoint's table (jobdist/admin.py), which also uses the request and reply
types here. docs/operations.md describes the pages and their rules.

Pages are Jinja2 templates (autoescaped: a step that prints `<script>` shows
it as text). A page fetched with `?fragment=1` is its content alone: the page's
script fetches that again when the event stream says something it shows
changed. Actions show only to a request carrying the admin token.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from http import HTTPStatus
from importlib import resources
from itertools import islice
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape

from . import client, clock, render, status
from .config import SiteConfig
from .couch import CouchError, Database
from .design import PEOPLE_DDOC
from .hub import ChangeHub
from .listener import feed_lag
from .logs import EventLog
from .model import Doc, Leaf, after_policy, sub_runs, targets
from .store import CouchStore

PAGE_SIZE = 50
HEARTBEAT = 15.0  # seconds between keep-alive comments on an idle event stream
MIN_EVENT_GAP = 0.3  # seconds: a burst of changes reaches a tab as one event
CANCEL_REASON = "cancelled by the dashboard"
STATIC_TYPES = {"dashboard.js": "text/javascript; charset=utf-8",
                "dashboard.css": "text/css; charset=utf-8"}


@dataclass
class Reply:
    """An answer of the admin endpoint: status, type, body and extra headers."""

    content_type: str
    body: bytes
    status: HTTPStatus = HTTPStatus.OK
    headers: dict[str, str] = field(default_factory=dict)
    stream: Generator[bytes] | None = None  # chunks sent after the body, as they come


class Refused(Exception):
    """A request the admin endpoint refuses: the status and one clear message."""

    def __init__(self, status: HTTPStatus, message: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


@dataclass
class Request:
    """A request as its route's handler sees it."""

    param: str = ""  # what the route's pattern took from the path: a job id, a file name
    query: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    authorized: bool = False  # it carries the admin token (a wrong one is refused before)


Handler = Callable[[Request], Reply]
Route = tuple[str, str, Handler]  # method, path pattern (a regular expression), handler


# --- what the pages show ----------------------------------------------------------


@dataclass(frozen=True)
class SiteRow:
    """A site as the overview shows it; None where this site does not know."""

    name: str
    running: list[Doc]
    busy: int
    here: bool = False
    workers: int | None = None
    free: int | None = None
    booked: int | None = None
    draining: bool | None = None
    last_seen: str = "never"
    silent: bool = True
    feed_seq: object = None
    feed_lag: int | None = None


def running_by_site(rows: list[Doc]) -> dict[str, list[Doc]]:
    """The `running` view's rows as the overview lists them: by site, with the command."""
    found: dict[str, list[Doc]] = {}
    for row in rows:
        doc, value = row.get("doc") or {}, row.get("value") or {}
        index = value.get("step", 0)
        steps = doc.get("job") or []
        step = steps[index] if isinstance(index, int) and index < len(steps) else {}
        found.setdefault(str(row["key"][0]), []).append({
            "job": row["id"], "step": index, "worker": value.get("executioner"),
            "since": render.short_time(row["key"][1]), "command": step.get("do"),
            "progress": render.progress_text(value)})  # (a broadcast: its site's part)
    return found


def step_rows(doc: Doc) -> list[Doc]:
    return [{"index": index, "state": render.step_state(doc, index),
             "target": ", ".join(targets(step)), "where": render.step_where(step),
             "command": step.get("do"), "alt_do": step.get("alt_do"),
             **execution(step, render.tries(doc, index)), "sites": sub_run_rows(doc, index)}
            for index, step in enumerate(doc["job"])]


def sub_run_rows(doc: Doc, index: int) -> list[Doc]:
    """A broadcast step's sub-runs, a row per site (none for a plain step)."""
    step = doc["job"][index]
    return [{"site": site, "state": render.sub_run_status(step, site, run),
             "worker": run.get("executioner"), **execution(run, render.tries(doc, index, site))}
            for site, run in sorted(sub_runs(step).items())]


def execution(record: Leaf, tries: int) -> Doc:
    """What a step or a sub-run's execution shows: tries, exit code, times, progress,
    output."""
    output = record.get("output")
    output = output if isinstance(output, dict) else {}
    return {"attempts": tries, "exit_code": record.get("exit_code"),
            "started": render.short_time(record.get("start_time")),
            "finished": render.short_time(record.get("finish_time")),
            "took": render.took_text(record), "progress": render.progress_text(record),
            "stdout": output.get("stdout"), "stderr": output.get("stderr")}


def output_sections(steps: list[Doc]) -> list[Doc]:
    """Each execution's output (a step's, or a broadcast step's at each site), open when
    it failed or runs, and the last one."""
    sections = [{"step": step["index"], "site": run.get("site"), "stdout": run["stdout"],
                 "stderr": run["stderr"], "open": run["state"] in ("failed", "running")}
                for step in steps for run in [step, *step["sites"]]
                if run["stdout"] or run["stderr"]]
    if sections:
        sections[-1]["open"] = True
    return sections


def timeline(doc: Doc) -> list[Doc]:
    """The history in order, each event with its offset from the job's creation."""
    history = doc.get("history", [])
    lost = render.lost_claims(history)
    start = parse_time(doc.get("created_at")) or parse_time(
        (history[0] if history else {}).get("at"))
    events = []
    for entry in history:
        at = parse_time(entry.get("at"))
        offset = None if at is None or start is None else (at - start).total_seconds()
        events.append({**entry, "at": render.short_time(entry.get("at")),
                       "offset": None if offset is None else f"+{offset:.1f}s",
                       "event": render.event_name(entry, lost).plain})
    return events


def parse_time(stamp: Any) -> datetime | None:
    """A time a document holds, or None when it holds none it can read."""
    try:
        return clock.parse_time(stamp) if isinstance(stamp, str) else None
    except ValueError:
        return None


# --- the dashboard ------------------------------------------------------------------


class Dashboard:
    """The pages of one daemon's dashboard; `routes` are its part of the admin endpoint."""

    def __init__(self, config: SiteConfig, known_sites: frozenset[str], hub: ChangeHub,
                 db: Database, own_status: Callable[[], Doc], writes: bool) -> None:
        """`writes`: whether an admin token is configured (without one, every action
        is refused, so the pages offer none and say why)."""
        self.config = config
        self.site = config.name
        self.writes = writes
        self.log = EventLog("jobdist.dashboard", site=self.site)
        self.known_sites = sorted(known_sites)
        self.hub = hub
        self.db = db  # quick timeouts: a page must not hang on a slow server
        self.own_status = own_status  # what GET /status answers: the same numbers
        self.heartbeat = HEARTBEAT
        self._closing = threading.Event()  # set by `close`: this endpoint's streams end
        self.templates = Environment(loader=PackageLoader("jobdist", "templates"),
                                     autoescape=select_autoescape(default=True),
                                     trim_blocks=True, lstrip_blocks=True)
        self.templates.filters.update(dash=lambda value: "-" if value in (None, "") else value,
                                      shorttime=render.short_time)

    def routes(self) -> list[Route]:
        return [("GET", "/", partial(self.page, "overview.html", self.overview)),
                ("GET", "/jobs", partial(self.page, "jobs.html", self.jobs)),
                ("GET", "/jobs/([^/]+)", partial(self.page, "job.html", self.job)),
                ("GET", "/events", self.stream_events),
                ("GET", "/static/([^/]+)", self.static),
                ("POST", "/jobs/([^/]+)/cancel", self.cancel)]

    def page(self, template: str, view: Callable[[Request], dict[str, Any] | Reply],
             request: Request) -> Reply:
        """The page `template` shows with what `view` found (or the reply it gave); one
        line saying why when the job or the site's CouchDB cannot be read."""
        code = HTTPStatus.OK
        try:
            values = view(request)
        except client.NoSuchJob as error:
            code, template, values = HTTPStatus.NOT_FOUND, "missing.html", {"message": str(error)}
        except client.NewerFormat as error:
            code, template, values = HTTPStatus.CONFLICT, "missing.html", {"message": str(error)}
        except CouchError as error:
            self.log.warning("dashboard cannot read", page=template, error=error)
            code, template = HTTPStatus.SERVICE_UNAVAILABLE, "missing.html"
            values = {"message": render.explain_couch_error(error, self.config)}
        if isinstance(values, Reply):
            return values
        html = self.templates.get_template(template).render(
            site=self.site, authorized=request.authorized, writes=self.writes,
            fragment=request.query.get("fragment") == "1", **values)
        return Reply("text/html; charset=utf-8", html.encode(), code)

    def static(self, request: Request) -> Reply:
        if request.param not in STATIC_TYPES:
            raise Refused(HTTPStatus.NOT_FOUND, f"no such file {request.param}")
        body = resources.files("jobdist").joinpath("static", request.param).read_bytes()
        return Reply(STATIC_TYPES[request.param], body)

    # -- pages --

    def overview(self, request: Request) -> dict[str, Any]:
        counts = client.count_by_status(self.db)
        return {"sites": self.sites(), "counts": {name: counts.get(name, 0)
                                                  for name in client.STATUSES}}

    def sites(self) -> list[SiteRow]:
        """Every site as this one sees it: itself from its own state, the others from
        their replicated status documents and the `running` view."""
        running = running_by_site(self.db.view(PEOPLE_DDOC, "running", include_docs=True))
        published = {parsed.site: parsed for doc in CouchStore(self.db).statuses()
                     if (parsed := status.SiteStatus.parse(doc))}
        now = datetime.now(UTC)
        rows = [self._own_row(running.get(self.site, []))]
        for name in sorted({*self.known_sites, *published, *running} - {self.site}):
            steps = running.get(name, [])
            if (parsed := published.get(name)) is None:
                rows.append(SiteRow(name, steps, busy=len(steps)))
                continue
            seen = parse_time(parsed.updated_at)
            rows.append(SiteRow(
                name, steps, busy=len(steps), workers=parsed.workers, free=parsed.free_workers,
                draining=parsed.draining, last_seen=render.short_time(parsed.updated_at),
                silent=seen is None or (now - seen).total_seconds() > status.STALE_AFTER))
        return rows

    def _own_row(self, running: list[Doc]) -> SiteRow:
        own = self.own_status()
        workers, received = own["workers"], own["feed"]["received"]
        try:
            latest = self.db.last_seq()
        except CouchError:
            latest = None
        return SiteRow(self.site, running, busy=workers["busy"], here=True,
                       workers=workers["size"], free=workers["free"], booked=workers["booked"],
                       draining=own["draining"], last_seen="now", silent=False,
                       feed_seq=received, feed_lag=feed_lag(latest, received))

    def jobs(self, request: Request) -> dict[str, Any] | Reply:
        query = request.query
        if query.get("id", "").strip():  # the search box
            return Reply("text/plain; charset=utf-8", b"", HTTPStatus.SEE_OTHER,
                         {"Location": f"/jobs/{quote(query['id'].strip(), safe='')}"})
        chosen = {name: query.get(name, "").strip() or None
                  for name in ("status", "site", "creator", "before")}
        if chosen["status"] not in (None, *client.STATUSES):
            raise Refused(HTTPStatus.BAD_REQUEST,
                          f"status must be one of {', '.join(client.STATUSES)}")
        rows = list(islice(client.list_jobs(self.db, status=chosen["status"],
                                            creator=chosen["creator"], site=chosen["site"],
                                            before=chosen["before"], page_size=PAGE_SIZE + 1),
                           PAGE_SIZE + 1))
        more = len(rows) > PAGE_SIZE
        rows = rows[:PAGE_SIZE]
        filters = {k: v for k, v in chosen.items() if v and k != "before"}
        older = (f"/jobs?{urlencode({**filters, 'before': rows[-1].created_at})}"
                 if more and rows else None)
        newest = f"/jobs?{urlencode(filters)}" if chosen["before"] else None
        return {"rows": rows, "filters": chosen, "statuses": client.STATUSES,
                "known_sites": self.known_sites, "older": older, "newest": newest}

    def job(self, request: Request) -> dict[str, Any]:
        doc, leaves = client.read_merged(self.db, self.site, request.param)
        return {"job": doc, "job_id": request.param, "conflicts": len(leaves) - 1,
                "status_text": render.job_status_text(doc),
                "failure": render.failure_reason(doc).removeprefix(" (").removesuffix(")"),
                "created": render.created_text(doc),
                "updated": render.short_time(doc.get("updated_at")),
                "steps": (steps := step_rows(doc)), "outputs": output_sections(steps),
                "events": timeline(doc),
                "awaited": client.awaited_statuses(self.db, doc),
                "after_policy": after_policy(doc),
                "live": doc.get("job_status") is None}

    # -- actions --

    def cancel(self, request: Request) -> Reply:
        """An authorized POST (the admin endpoint checked the token and the origin)."""
        job_id = request.param
        try:
            cancelled = client.cancel(self.db, self.site, job_id, CANCEL_REASON)
        except client.NoSuchJob as error:
            raise Refused(HTTPStatus.NOT_FOUND, str(error)) from None
        except (client.StillConflicting, client.NewerFormat) as error:
            raise Refused(HTTPStatus.CONFLICT, str(error)) from None
        if not cancelled.written:
            return json_reply({"cancelled": False, "message":
                               f"{job_id} had already ended: {cancelled.job['job_status']}"})
        self.log.info("dashboard cancelled", job=job_id, step=cancelled.job["step"])
        return json_reply({"cancelled": True, "message": f"{job_id} cancelled"})

    # -- live updates --

    def stream_events(self, request: Request) -> Reply:
        """What changed, as Server-Sent Events, until the client goes away (a write
        fails: at the latest at the next heartbeat) or the endpoint stops."""
        events = self._events()
        first = next(events)  # joins the hub or refuses; from here on, closing leaves it
        return Reply("text/event-stream", first, headers={"X-Accel-Buffering": "no"},
                     stream=events)

    def _events(self) -> Generator[bytes]:
        if not self.hub.join():
            raise Refused(HTTPStatus.SERVICE_UNAVAILABLE,
                          f"too many event streams open (at most {self.hub.max_clients})")
        seen = self.hub.published
        try:
            yield b"retry: 2000\n: connected\n\n"
            while not self._closing.is_set():
                seen, change = self.hub.read(seen, self.heartbeat, self._closing.is_set)
                if change is None:
                    yield b": keep-alive\n\n"
                    continue
                yield f"event: change\ndata: {json.dumps(change, default=str)}\n\n".encode()
                time.sleep(MIN_EVENT_GAP)  # a burst of changes reaches a tab as one event
        finally:
            self.hub.leave()

    def close(self) -> None:
        """End this endpoint's event streams: their handlers return at once."""
        self._closing.set()
        self.hub.wake()


def json_reply(value: Any, status: HTTPStatus = HTTPStatus.OK,
               headers: dict[str, str] | None = None) -> Reply:
    return Reply("application/json", json.dumps(value, default=str).encode() + b"\n", status,
                 headers or {})

