"""The site daemon: listener, work manager, workers and keep-alive, supervised.

The thesis's process layout (listener_sup over listener, work manager,
workers and "keep docs alive") as threads of one process. It talks only to
its own site's CouchDB. SIGTERM or SIGINT stops it gracefully: no new claims,
running steps get `shutdown_grace` seconds, then are stopped and released.
With `[admin] port` set it also serves its admin HTTP endpoint (jobdist/admin.py).
"""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

from .admin import AdminServer, resident_memory_bytes
from .config import SiteConfig
from .couch import Database, Forbidden
from .hub import ChangeHub
from .journal import Journal
from .keepalive import KeepAlive
from .listener import Listener
from .logs import EventLog
from .mailbox import Mailbox
from .manager import Manager, site_pool
from .retention import PeriodicCleanup
from .schedules import Scheduler
from .setup import check_database, couch_of, setup_database
from .store import CouchStore


def open_site_database(config: SiteConfig) -> Database:
    """The site's jobs database, with our design documents.

    The daemon logs in as its site's user, never as the admin. With security
    on, `jobdist setup` has set the database up and the daemon only checks;
    on a server without admins (a test or a fresh development server) it sets
    the database up itself.
    """
    as_site = replace(config, couch=replace(config.couch, admin_user=None, admin_password=None))
    log = EventLog("jobdist.daemon", site=config.name)
    try:
        setup_database(as_site, report=lambda line: log.info("setup", detail=line))
    except Forbidden:
        check_database(config)
    return couch_of(config).database(config.couch.database)


class Daemon:
    def __init__(self, config: SiteConfig, known_sites: set[str] | None = None) -> None:
        config.require_credentials()
        self.config = config
        self.log = EventLog("jobdist.daemon", site=config.name)
        self.db = open_site_database(config)
        sites = known_sites or {config.name, *config.peers}
        self.mailbox = Mailbox()
        self.pool = site_pool(config, self.mailbox)
        # The manager's writes: one thread, so that it serves reports while one is in flight.
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jobdist-writer")
        store = CouchStore(self.db)
        self.manager = Manager(config, store, sites, Journal(config.journal_dir()),
                               self.pool, self.mailbox, self.writer)
        self.stop_event = self.manager.stop_event
        self.started = time.monotonic()
        self.changes = ChangeHub()  # the feed, fanned out to the dashboard's event streams
        self.listener = Listener(self.db, config.name, self.mailbox.inbox,
                                 store.load_checkpoint(config.name), self.stop_event,
                                 self.mailbox.wake, on_change=self.changes.publish)
        self.keepalive = KeepAlive(self.db, config.name, config.timings.keepalive_period,
                                   config.timings.keepalive_stale_after, self.stop_event,
                                   room=lambda: self.manager.room_seen)
        self.retention = None if config.retention.older_than is None else PeriodicCleanup(
            self.db, config.name, config.retention.older_than,
            config.retention.interval, config.retention.export, self.stop_event)
        self.scheduler = Scheduler(self.db, config.name, self.stop_event)
        self.admin: AdminServer | None = None

    @property
    def known_sites(self) -> frozenset[str]:
        """This site and every site it knows of (its peers, the sites directory's)."""
        return self.manager.known_sites

    def status(self) -> dict[str, Any]:
        """What the admin endpoint shows of this site (GET /status, the metrics, the
        dashboard): read from the parts' thread-safe state, never a setting, so never
        a credential."""
        manager = self.manager
        workers = self.pool.snapshot()
        running = workers.pop("running")
        return {
            "site": self.config.name,
            "workers": workers,
            "draining": manager.draining,
            "running": running,
            "feed": {
                "seq": manager.seq,  # the last change decided on: an int or a CouchDB sequence
                "received": self.listener.since,
                "queued": self.mailbox.inbox.qsize(),
                "reconnects": self.listener.reconnects,
            },
            "journal": manager.journal_status(),
            "keepalive_period": self.keepalive.period,
            "keepalive_resaves": self.keepalive.resaved,
            "keepalive_left_for_room": self.keepalive.left_for_room,
            "uptime_seconds": round(time.monotonic() - self.started, 3),
            "memory_bytes": resident_memory_bytes(),
            "counts": dict(manager.counts),  # one C-level copy: safe beside the manager thread
        }

    def resize_workers(self, size: int) -> dict[str, int]:
        """Resize the pool (running steps are never killed); its sizes after."""
        self.pool.resize(size)
        self.mailbox.wake.set()  # new free slots: let the manager look for work now
        workers = self.pool.snapshot()
        workers.pop("running")
        return workers

    def set_keepalive_period(self, period: float) -> float:
        """Change the keep-alive period from its next pass; the period before."""
        before = self.keepalive.period
        self.keepalive.period = period  # read by the keep-alive thread each pass
        return before

    def run(self, ready_file: Path | None = None) -> int:
        self._install_signal_handlers()
        self.log.info("site starting", couch=self.db.couch.url, db=self.config.couch.database,
                      workers=self.config.workers,
                      journal=self.manager.journal.directory.resolve())
        self._start_admin()  # first: a port that is taken fails before any work starts
        try:
            self.manager.recover()
            self.listener.start()
            self.keepalive.start()
            self.scheduler.start()
            if self.retention is not None:
                self.retention.start()
            if ready_file is not None:
                ready_file.write_text(str(time.time()))
            self.log.info("site ready")
            while not self.stop_event.is_set():
                self.manager.serve_once(timeout=0.5)
            self.log.info("site stopping", grace=self.config.daemon.shutdown_grace)
            self.manager.drain(self.config.daemon.shutdown_grace)
        finally:
            self.writer.shutdown(wait=True)
            if self.admin is not None:  # kept through the drain, to watch steps stop
                self.admin.stop()
        self.log.info("site stopped")
        return 0

    def stop(self) -> None:
        self.stop_event.set()

    def _start_admin(self) -> None:
        if self.config.admin.port is None:
            return
        self.admin = AdminServer(self, self.config.admin.host, self.config.admin.port,
                                 self.config.admin.token)
        self.admin.start()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handle(signum: int, frame: FrameType | None) -> None:
            self.log.info("signal received", signal=signal.Signals(signum).name)
            self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)
