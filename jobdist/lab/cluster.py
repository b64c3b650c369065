"""The local cluster: a CouchDB-compatible server and a daemon for every site.

`up` starts, for each site config of a sites directory, a pouchdb-server on
the site's port and a `jobdist site run` daemon, both in sessions of their
own so they outlive the command; sets up continuous replication from every
site to each of its peers (so every pair of peers replicates both ways);
and returns when every daemon says it is ready. Run again while the cluster
is up, `up` starts whatever of it is stopped (a site's server, a daemon, each
checked by its recorded pid) and leaves the rest alone. Security is on: the
credentials files the configs name are generated when missing (random
passwords, mode 600), each server gets its admin, and setup creates the
site users and locks the jobs databases to them. Pids and logs live under a
state directory; `down` stops exactly the processes recorded there, after
checking that each pid is still the process we started.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..config import SiteConfig, ensure_credentials, load_sites
from ..couch import Couch, CouchError
from ..errors import JobdistError
from ..setup import setup_sites
from ..status import status_id
from .localserver import LocalServer, answers, listening, pouchdb_server, private_dir
from .netns import HostNetwork

DEFAULT_STATE_DIR = Path(".jobdist")
CONNECT_WAIT = 15.0  # seconds `up` waits for every site to see every other status


class ClusterError(JobdistError, RuntimeError):
    """The local cluster could not be brought up or down."""


@dataclass(frozen=True)
class Proc:
    """A process we started: its pid and start time (guards against pid reuse)."""

    pid: int
    started: str

    @classmethod
    def of(cls, pid: int) -> Proc:
        return cls(pid, process_start_time(pid))

    def alive(self) -> bool:
        return process_start_time(self.pid) == self.started != ""

    def stop(self, timeout: float = 15.0) -> None:
        stop_all([self], timeout)


def stop_all(procs: list[Proc], timeout: float = 15.0) -> None:
    """SIGTERM every live one at once, wait for them together, SIGKILL what outlives it."""
    alive = [proc for proc in procs if proc.alive()]
    for proc in alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(proc.alive() for proc in alive) and time.monotonic() < deadline:
        time.sleep(0.05)
    for proc in alive:
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def process_start_time(pid: int) -> str:
    """Field 22 of /proc/PID/stat, or "" when there is no such live process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[1].split()
    return "" if fields[0] == "Z" else fields[19]


class LocalCluster:
    def __init__(self, sites_dir: Path, state_dir: Path = DEFAULT_STATE_DIR,
                 in_memory: bool = False, network: HostNetwork | None = None) -> None:
        """`network`: each site's server and daemon run in its namespace there (the
        sites' URLs name their addresses in it: scenarios.write_sites `hosts`)."""
        self.sites = load_sites(sites_dir)
        self.network = network
        self.sites_dir = Path(sites_dir)
        self.state_dir = Path(state_dir)
        self.in_memory = in_memory
        self.state_file = self.state_dir / "cluster.json"
        # The fault storm restarts daemons from several threads at once: each change
        # of the state file is a read, a change and a write that must not interleave.
        self._state_lock = threading.RLock()

    # --- lifecycle --------------------------------------------------------------

    def up(self, timeout: float = 60.0) -> list[str]:
        """Start the cluster, or, when part of it runs, whatever of it is stopped; the
        servers and daemons started ("reg_a server", ...)."""
        pouchdb_server()  # not installed or unpatched: one line now, not a supervisor's log
        if self._recorded():
            return self._start_stopped(timeout)
        private_dir(self.state_dir)  # servers' data holds the replications' credentials
        self.sites = ensure_credentials(self.sites, self.sites_dir)
        state: dict[str, Any] = {"sites_dir": str(self.sites_dir.resolve()),
                                 "in_memory": self.in_memory, "sites": {}}
        try:
            for site in self.sites.values():
                self._forget_replications(site)
                state["sites"][site.name] = {"server": self._start_server(site)}
                self._save(state)
            setup_sites(self.sites)
            for site in self.sites.values():
                state["sites"][site.name]["daemon"] = self._start_daemon(site)
                self._save(state)
            self._wait_ready(timeout)
            self._wait_connected(min(timeout, CONNECT_WAIT))
        except BaseException:
            self.down()
            raise
        return [f"{name} {role}" for name in self.sites for role in ("server", "daemon")]

    def _start_stopped(self, timeout: float) -> list[str]:
        """Start the servers, then the daemons, that are not running: the rest of the
        cluster runs on, its replications, data and pids as they are."""
        state = self._load()
        if state.get("sites_dir") != str(self.sites_dir.resolve()):
            raise ClusterError(f"a cluster of {state.get('sites_dir')} is up (state in "
                               f"{self.state_dir}); run `jobdist cluster down` first")
        self.in_memory = state.get("in_memory", self.in_memory)
        servers = self.stopped("server")
        for name in servers:
            self._record(name, "server", self._start_server(self.sites[name]))
        if servers:  # (idempotent) an in-memory server comes back empty
            setup_sites(self.sites, [self.sites[name] for name in servers])
        daemons = self.stopped("daemon")
        for name in daemons:
            self._record(name, "daemon", self._start_daemon(self.sites[name]))
        self._wait_ready(timeout, daemons)
        return [*(f"{name} server" for name in servers), *(f"{name} daemon" for name in daemons)]

    def stopped(self, role: str) -> list[str]:
        """The sites whose server (or daemon) is not running: none recorded, or gone."""
        recorded = self._load().get("sites", {})
        return [name for name in self.sites
                if not (role in recorded.get(name, {})
                        and Proc(**recorded[name][role]).alive())]

    def _record(self, name: str, role: str, proc: dict[str, Any]) -> None:
        with self._state_lock:
            state = self._load()
            state["sites"].setdefault(name, {})[role] = proc
            self._save(state)

    def __enter__(self) -> LocalCluster:
        # A command that brings sites up for its own run (bench, demo) stops them
        # when it is told to stop: SIGTERM unwinds through __exit__ as SIGINT does.
        self._sigterm = interrupt_on_sigterm()
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.down()
        finally:
            if self._sigterm is not None:
                signal.signal(signal.SIGTERM, self._sigterm)

    def down(self) -> list[str]:
        """Stop every process recorded in the state directory; what was stopped.

        The daemons first, all at once (each drains while its server still
        answers), then the servers, all at once.
        """
        sites = self._load().get("sites", {})
        stopped = []
        for role in ("daemon", "server"):
            procs = {name: Proc(**roles[role]) for name, roles in sites.items() if role in roles}
            alive = {name: proc for name, proc in procs.items() if proc.alive()}
            stop_all(list(alive.values()))
            stopped += [f"{name} {role} (pid {proc.pid})" for name, proc in alive.items()]
        self.state_file.unlink(missing_ok=True)
        return stopped

    def status(self) -> list[dict[str, Any]]:
        state = self._load()
        rows = []
        for name, site in self.sites.items():
            procs = state.get("sites", {}).get(name, {})
            rows.append({
                "site": name,
                "url": site.couch.url,
                "fauxton": f"{site.couch.url}/_utils",
                "dashboard": dashboard_url(site),
                "server": _describe(procs.get("server")),
                "daemon": _describe(procs.get("daemon")),
            })
        return rows

    # --- pieces ---------------------------------------------------------------------

    def site_dir(self, name: str) -> Path:
        return self.state_dir.resolve() / name

    def _start_server(self, site: SiteConfig, timeout: float = 60.0) -> dict[str, Any]:
        """A supervisor process that runs the site's server and restarts it if it dies."""
        data = self.site_dir(site.name) / "couch"
        data.mkdir(parents=True, exist_ok=True)
        (data / "server.pid").unlink(missing_ok=True)
        host = urlsplit(site.couch.url).hostname or "127.0.0.1"
        args = [sys.executable, "-m", "jobdist.lab.localserver", "--port", str(site.couch.port),
                "--host", host, "--dir", str(data),
                *(["--in-memory"] if self.in_memory else [])]
        if site.couch.admin_credentials is not None:
            args += ["--admin-credentials", str(site.couch.admin_credentials)]
        with open(data / "supervisor.log", "ab") as log:
            process = subprocess.Popen(self._on_host(site.name, args), stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=log, start_new_session=True)
        supervisor = Proc.of(process.pid)
        try:
            # Never started: only asks who answers.
            probe = LocalServer(site.couch.port, data, host=host)
            deadline = time.monotonic() + timeout
            while not (answers(probe.url) and probe.answering_is_us()):
                if not supervisor.alive() or time.monotonic() > deadline:
                    taken = (", a port another process holds"
                             if supervisor.alive() and listening(host, site.couch.port) else "")
                    raise ClusterError(f"the server of site {site.name} did not start on "
                                       f"port {site.couch.port}{taken}; see "
                                       f"{data / 'supervisor.log'}")
                time.sleep(0.05)
        except BaseException:  # (an interrupt too) not in the state file yet: down() misses it
            supervisor.stop()
            raise
        return supervisor.__dict__

    def _forget_replications(self, site: SiteConfig) -> None:
        """Drop the server's `_replicator` database before it starts: setup writes the
        replications this topology needs, and pouchdb-server will neither edit a running
        replication of another topology nor survive its deletion."""
        shutil.rmtree(self.site_dir(site.name) / "couch" / "_replicator", ignore_errors=True)

    def server_pid(self, name: str) -> int:
        """The pid of the site's pouchdb-server itself (its supervisor writes it)."""
        return int((self.site_dir(name) / "couch" / "server.pid").read_text())

    def _start_daemon(self, site: SiteConfig,
                      env: dict[str, str] | None = None) -> dict[str, Any]:
        directory = self.site_dir(site.name)
        ready = directory / "ready"
        ready.unlink(missing_ok=True)
        assert site.path is not None
        args = [sys.executable, "-m", "jobdist", "site", "run", "--config", str(site.path),
                "--sites", str(self.sites_dir), "--ready-file", str(ready),
                "--log-file", str(directory / "daemon.log"),
                "--journal", str(self.state_dir.resolve() / "journal")]  # (in it: SITE/)
        process = subprocess.Popen(self._on_host(site.name, args), stdin=subprocess.DEVNULL,
                                   env={**os.environ, **(env or {})},
                                   stdout=subprocess.DEVNULL,
                                   stderr=open(directory / "daemon.err", "ab"),  # noqa: SIM115
                                   start_new_session=True)
        return Proc.of(process.pid).__dict__

    def _on_host(self, name: str, args: list[str]) -> list[str]:
        return self.network.command(name, args) if self.network else args

    def start_daemon(self, name: str, env: dict[str, str] | None = None) -> None:
        """(Re)start one site's daemon, e.g. after a crash test killed it; `env` adds
        to its environment (the fault suite skews a clock with JOBDIST_CLOCK_OFFSET)."""
        self._record(name, "daemon", self._start_daemon(self.sites[name], env))
        self._wait_ready(60.0, [name])

    def stop_site(self, name: str) -> None:
        """Stop a site's daemon and its server (the supervisor too): the site is down."""
        procs = self._load()["sites"][name]
        for role in ("daemon", "server"):
            Proc(**procs[role]).stop()

    def start_site(self, name: str) -> None:
        """Start a stopped site's server again, then its daemon."""
        self._record(name, "server", self._start_server(self.sites[name]))
        self.start_daemon(name)

    def daemon_proc(self, name: str) -> Proc:
        return Proc(**self._load()["sites"][name]["daemon"])

    def _wait_ready(self, timeout: float, names: list[str] | None = None) -> None:
        deadline = time.monotonic() + timeout
        waiting = list(self.sites) if names is None else list(names)
        while waiting:
            name = waiting[0]
            if (self.site_dir(name) / "ready").exists():
                waiting.pop(0)
                continue
            if not self.daemon_proc(name).alive():
                raise ClusterError(f"the daemon of site {name} exited at start; see "
                                   f"{self.site_dir(name) / 'daemon.log'}")
            if time.monotonic() > deadline:
                raise ClusterError(f"the daemon of site {name} did not get ready in time")
            time.sleep(0.1)

    def _wait_connected(self, timeout: float) -> None:
        """Wait until every site has every other site's status document.

        Then replication carries documents every way, and each creator knows the
        others' room: the state a cluster that has run a while is in, which is
        what a demo or a benchmark means to measure. Not an error when late: a
        test may cut links on purpose.
        """
        deadline = time.monotonic() + timeout
        dbs = {name: Couch(site.couch.url, user=site.couch.user, password=site.couch.password,
                           retries=1).database(site.couch.database)
               for name, site in self.sites.items()}
        missing = {(name, other) for name in dbs for other in dbs if other != name}
        while missing and time.monotonic() < deadline:
            for name, other in sorted(missing):
                with contextlib.suppress(CouchError):
                    if dbs[name].get(status_id(other)) is not None:
                        missing.discard((name, other))
            time.sleep(0.1)

    def _recorded(self) -> bool:
        state = self._load()
        return any(Proc(**procs[role]).alive() for procs in state.get("sites", {}).values()
                   for role in procs)

    def _load(self) -> dict[str, Any]:
        with self._state_lock:
            try:
                return json.loads(self.state_file.read_text())
            except (OSError, ValueError):
                return {}

    def _save(self, state: dict[str, Any]) -> None:
        with self._state_lock:
            self.state_file.write_text(json.dumps(state, indent=2))


def interrupt_on_sigterm() -> signal.Handlers | Any:
    """Make SIGTERM interrupt the main thread as Ctrl-C does (a CI timeout, `kill PID`),
    so every `finally` and `with` stops what it started; the handler it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    return signal.signal(signal.SIGTERM, interrupt)


def dashboard_url(site: SiteConfig) -> str | None:
    """The site's dashboard (its daemon's admin endpoint), when it has a fixed port."""
    if not site.admin.port:
        return None
    host = site.admin.host
    return f"http://{f'[{host}]' if ':' in host else host}:{site.admin.port}/"


def _describe(proc: dict[str, Any] | None) -> str:
    if not proc:
        return "not started"
    return f"running (pid {proc['pid']})" if Proc(**proc).alive() else "stopped"
