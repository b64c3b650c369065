"""One local CouchDB-compatible server (pouchdb-server) for a site or a test.

Production sites run Apache CouchDB 3; this machine has no CouchDB package, so
the local cluster and the tests run pouchdb-server 4.2.0, installed from the
project's own npm lock file (`npm ci`). We start it in a session of its own and
only ever signal the pid we started, so stopping a server never touches
anything else on the machine.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import requests

from ..errors import JobdistError
from ..processes import signal_group

# Running from a checkout (an editable install, or the source tree on sys.path), the
# checkout's own `npm ci` installed the server in node_modules beside the package.
CHECKOUT = Path(__file__).resolve().parents[2]  # jobdist/lab/ → the checkout
log = logging.getLogger("jobdist.lab.localserver")


class ServerError(JobdistError, RuntimeError):
    """The local server could not be found, started or reached."""


# The pouchdb-server 4.2.0 fixes we rely on, applied at install time by `npm ci`
# (patches/*.patch, see the reason in each): the fix, the file it changes (as a
# package requires it) and a line it writes there. The first two are for correctness,
# the seventh keeps a site that was down from waiting for its peers' documents after
# it is back; speed, measured in the benchmarks, is why the others are here.
REQUIRED_FIXES = (
    ("replicated conflicts kept when validate_doc_update exists",
     "pouchdb-validation/lib/index.js",
     "// jobdist: keep the history a replicated revision arrives with."),
    ("no crash on a database creation refused by security",
     "express-pouchdb/lib/routes/db.js",
     "// jobdist: refused by security, PouchDB.new() is a rejected promise."),
    ("map functions compiled once",
     "pouchdb-mapreduce/lib/index.js",
     "var compiledInVm = new Map();"),
    ("validate_doc_update evaluated once a design revision",
     "pouchdb-validation/lib/index.js",
     "// jobdist: evaluate a design document's validate_doc_update once per revision of"),
    ("disk size read at most every 5 s",
     "pouchdb-size/lib/index.js",
     "var SIZE_MAX_AGE_MS = 5000;"),
    ("changes that arrive during a replicated batch sent as one batch",
     "pouchdb-replication/lib/index.js",
     "// jobdist: while a batch is in flight, let changes gather; the batch's end"),
    ("a failing replication retried at least once a second",
     "pouchdb-replication/lib/index.js",
     "// jobdist: retry at least once a second. The default doubles up to 10 minutes,"),
    ("replication connections kept alive, no gzip, no cookie jar",
     "pouchdb-fetch/lib/index.js",
     "var fetch = keptAliveFetch;"),
    ("CouchDB 3's `update=lazy` in view queries",
     "express-pouchdb/lib/routes/views.js",
     "// jobdist: CouchDB 3's `update` is PouchDB's `stale`."),
    ("a basic-auth session kept until a user or an admin changes",
     "express-pouchdb/lib/routes/authentication.js",
     "// jobdist: a basic-auth session is kept, by a hash of the request's Authorization"),
    ("no request log line built below the log level",
     "express-pouchdb/lib/routes/http-log.js",
     "// jobdist: below the logger's level (0 debug, 1 info), no line to format nor an"),
    ("answers copied by Buffer.from, one body parser a size limit",
     "express-pouchdb/lib/utils.js",
     "// jobdist: one parser a size limit, not one built for every request."),
)
INSTALL_HINT = ("run `npm ci` in the jobdist checkout, or set JOBDIST_POUCHDB_SERVER to a "
                "pouchdb-server that a checkout's `npm ci` installed")


def pouchdb_server() -> Path:
    """The pouchdb-server to run, found and checked; ServerError says what to do if not."""
    binary = find_pouchdb_server()
    missing = missing_fixes(binary)
    if missing:
        raise ServerError(f"the pouchdb-server at {binary} lacks jobdist's fix "
                          f"({'; '.join(missing)}): run `npm ci` in the jobdist checkout, "
                          "which applies patches/")
    return binary


def find_pouchdb_server() -> Path:
    """$JOBDIST_POUCHDB_SERVER, else node_modules/.bin of the checkout or of the current
    directory, else PATH."""
    explicit = os.environ.get("JOBDIST_POUCHDB_SERVER")
    if explicit:
        if not Path(explicit).is_file():
            raise ServerError(f"JOBDIST_POUCHDB_SERVER={explicit}: no such file")
        return Path(explicit)
    for base in (CHECKOUT, Path.cwd()):
        binary = base / "node_modules" / ".bin" / "pouchdb-server"
        if binary.is_file():
            return binary
    found = shutil.which("pouchdb-server")
    if found is None:
        raise ServerError(f"pouchdb-server is not installed: {INSTALL_HINT}")
    return Path(found)


def missing_fixes(binary: Path) -> list[str]:
    """The fixes above that the installation `binary` runs from lacks."""
    missing = []
    for fix, relative, line in REQUIRED_FIXES:
        path = node_resolve(binary.resolve().parent, relative)
        if path is None or line not in path.read_text(encoding="utf-8", errors="replace"):
            missing.append(fix)
    return missing


def node_resolve(start: Path, relative: str) -> Path | None:
    """The file Node loads for `require(relative)` from a script in `start`."""
    for directory in (start, *start.parents):
        if directory.name != "node_modules" and (directory / "node_modules" / relative).is_file():
            return directory / "node_modules" / relative
    return None


def node_command() -> list[str]:
    """Node, told to warn about a rejected promise nobody handles instead of exiting.

    pouchdb-server 4.2.0 was written for Node 8-10, where that was the default;
    since Node 15 one such promise (some refusals with authentication on) ends
    the whole server. Warned, it costs one request.
    """
    node = shutil.which("node")
    if node is None:
        raise ServerError("node is not installed: pouchdb-server needs Node 20")
    return [node, "--unhandled-rejections=warn"]


def private_dir(path: Path) -> None:
    """A directory only its owner may enter, made so if it exists already."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)


_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()
_port_choice = random.Random()  # its own: never moves a seeded global sequence
LOWEST_PORT = 10000


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, below the range the
    kernel picks a connection's own port from, and not handed out before by this process.

    A port is free only until its server binds it. The kernel's own pick (bind to port
    0) repeats a just-released port within a few hundred calls, and any process's
    outgoing connection may take a port of its ephemeral range: a storm's proxy once
    took a site server's port, and the server never started (CI, 2026-11-27).
    """
    high = _ephemeral_low()
    with _handed_out_lock:
        for _ in range(1000):
            port = _port_choice.randrange(LOWEST_PORT, high)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    raise ServerError(f"no free TCP port between {LOWEST_PORT} and {high}")


def _ephemeral_low() -> int:
    """The lowest port the kernel gives outgoing connections (Linux's default: 32768)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
    return max(low, LOWEST_PORT + 1000)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class LocalServer:
    """A pouchdb-server process that we started and alone stop, on 127.0.0.1 or on
    `host` (a site's own address in a network namespace: jobdist.lab.netns)."""

    def __init__(
        self,
        port: int,
        data_dir: Path,
        *,
        in_memory: bool = False,
        startup_timeout: float = 30.0,
        admin: tuple[str, str] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.port = port
        self.host = host
        self.data_dir = Path(data_dir)
        self.in_memory = in_memory
        self.admin = admin  # (user, password): no admin party when set
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    def start(self, stop: threading.Event | None = None) -> None:
        """Start the server and return once `GET /` answers; ServerError if it does not,
        or if `stop` is set meanwhile (the server is stopped then)."""
        if self.is_alive():
            return
        # LevelDB files and config.json hold the replications' credentials.
        private_dir(self.data_dir)
        binary = pouchdb_server()
        self._write_config()
        args = [
            *node_command(), str(binary),
            "--port", str(self.port),
            "--host", self.host,
            "--dir", str(self.data_dir),
            "--config", str(self.config_path),
        ]
        if self.in_memory:
            args.append("--in-memory")
        with open(self.log_path, "ab") as log:
            # cwd=data_dir: pouchdb-server writes its log.txt to the working directory.
            self.process = subprocess.Popen(
                args,
                cwd=self.data_dir,
                umask=0o077,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_until_ready(stop)

    @property
    def config_path(self) -> Path:
        return self.data_dir / "config.json"

    def _write_config(self) -> None:
        """Write the server's config file before it starts: its admin and its logging.

        pouchdb-server replaces the plain password with a salted hash at start;
        an admin already there is left alone. It logs warnings and errors only,
        and does not copy its log to stdout: a line for every request cost a
        tenth of its CPU (`bench throughput --requests` turns debug on while it
        counts). Its `--no-stdout-logs` flag is read as "stdout-logs: no" and
        never takes effect, so the setting goes in the file. Only the owner may
        read the file.
        """
        try:
            config = json.loads(self.config_path.read_text())
        except (OSError, ValueError):
            config = {}
        before = json.dumps(config, sort_keys=True)
        config.setdefault("log", {}).setdefault("level", "warning")
        config.setdefault("pouchdb_server", {})["no-stdout-logs"] = True
        if self.admin is not None:
            user, password = self.admin
            config.setdefault("admins", {}).setdefault(user, password)
        if json.dumps(config, sort_keys=True) != before:
            fd = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as file:
                json.dump(config, file)
        os.chmod(self.config_path, 0o600)

    def _wait_until_ready(self, stop: threading.Event | None) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if stop is not None and stop.is_set():
                # A supervisor told to stop must not wait out the start: the cluster
                # SIGKILLs it after 15 s, and the server, in a session of its own,
                # would outlive it.
                self.stop()
                raise ServerError(f"pouchdb-server on port {self.port}: stopped while starting")
            if not self.is_alive():
                raise ServerError(
                    f"pouchdb-server on port {self.port} exited at start; see {self.log_path}"
                )
            if answers(self.url) and self.answering_is_us():
                return
            time.sleep(0.05)
        self.stop()
        raise ServerError(f"pouchdb-server on port {self.port} did not answer in time "
                          "(or another server holds the port)")

    def answering_is_us(self) -> bool:
        """The server on our port wrote its uuid to our config file: it is ours."""
        try:
            ours = json.loads(self.config_path.read_text())["couchdb"]["uuid"]
            return requests.get(self.url, timeout=2).json().get("uuid") == ours
        except (OSError, ValueError, KeyError, requests.RequestException):
            return False

    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ensure_running(self) -> bool:
        """Restart the server if it died; True when a restart happened."""
        if self.is_alive():
            return False
        self.start()
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """Stop exactly the process we started (its session, nothing else)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout)
        self.process = None

    def kill(self) -> None:
        """Kill the server abruptly (SIGKILL), as a crash would."""
        if self.process is not None and self.process.poll() is None:
            signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


def listening(host: str, port: int) -> bool:
    """Whether anything accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def supervise(server: LocalServer, stop: threading.Event, pid_file: Path | None = None) -> None:
    """Keep the server running until `stop` is set: restart it whenever it dies.

    Restarts back off (up to 10 s) while the server keeps dying at once, so a
    server that cannot start does not spin.
    """
    backoff = 0.5
    while not stop.is_set():
        started = time.monotonic()
        try:
            server.start(stop)
        except ServerError as error:
            log.error("server did not start port=%d error=%s", server.port, error)
        else:
            if pid_file is not None:
                pid_file.write_text(str(server.pid))
            while server.is_alive() and not stop.wait(0.2):
                pass
            if stop.is_set():
                break
            log.warning("server died port=%d pid=%s: restarting", server.port, server.pid)
        if time.monotonic() - started > 30:
            backoff = 0.5  # it ran for a while: this is a new failure, not a crash loop
        stop.wait(backoff)
        backoff = min(backoff * 2, 10.0)
    server.stop()


def main() -> None:
    """`python -m jobdist.lab.localserver --port P --dir D [--host H] [--in-memory]
    [--admin-credentials F]`: a supervised server; with F (a credentials file), F's
    user is its admin."""
    import argparse

    from ..secret_files import read_credentials

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--in-memory", action="store_true")
    parser.add_argument("--admin-credentials", type=Path)
    args = parser.parse_args()
    admin = read_credentials(args.admin_credentials) if args.admin_credentials else None
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server = LocalServer(args.port, args.dir, in_memory=args.in_memory, admin=admin,
                         host=args.host)
    supervise(server, stop, args.dir / "server.pid")


if __name__ == "__main__":
    main()
