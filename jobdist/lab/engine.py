"""A private Docker engine for the container tests: started by pid, always stopped.

The tests need a real engine but must leave the machine as they found it. We
install Debian's `docker.io` when `dockerd` is missing, and start one `dockerd`
of our own with flags that leave the host's network alone (no iptables rules,
no IP forwarding, no masquerading, no `docker0` bridge), its own exec root and
socket, and a fixed data root under the cache directory, so the images built
once are there for the next run. Stopping it kills the containers, stops that
one pid, unmounts what it left mounted and removes its cgroups and its
containerd directory, pass or fail. Compose v2 is not in bookworm: we take
trixie's `docker-compose` package, fetched with an apt configuration of our own
(the machine's apt sources are never changed), as a CLI plugin in our own
DOCKER_CONFIG.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import JobdistError
from ..processes import signal_group

CACHE = Path(os.environ.get("JOBDIST_DOCKER_CACHE",
                            Path.home() / ".cache" / "jobdist-docker"))
DOCKERD_FLAGS = ("--iptables=false", "--ip-forward=false", "--ip-masq=false", "--bridge=none")
PACKAGES = {"dockerd": "docker.io", "mmdebstrap": "mmdebstrap"}  # binary: Debian package
COMPOSE_SUITE = "trixie"  # the first Debian release with compose v2 (bookworm has v1)
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Directories dockerd and its containerd make outside their roots (plugin discovery,
# shims): removed after it stops unless they were there before.
RUN_DIRS = (Path("/run/containerd"), Path("/run/docker"))
log = logging.getLogger("jobdist.lab.engine")


class EngineUnavailable(JobdistError):
    """This machine cannot run a Docker engine (the reason says why): tests skip."""


class EngineError(JobdistError, RuntimeError):
    """The engine, or what it needs, could not be installed or started."""


@dataclass
class Engine:
    """A running private dockerd: its client and what a `docker` command needs."""

    client: Any  # docker.DockerClient
    pid: int
    exec_root: Path
    env: dict[str, str]  # DOCKER_HOST and DOCKER_CONFIG, over os.environ

    def docker(self, *args: str, timeout: float = 600, check: bool = True,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run the `docker` command line (e.g. `compose ...`) against this engine;
        `env`, when given, must hold this engine's own variables."""
        return run(["docker", *args], env=env or self.env, timeout=timeout, check=check)


def unavailable_reason() -> str | None:
    """Why this machine cannot run an engine, or None when it can."""
    if os.geteuid() != 0:
        return "not root: starting dockerd needs root"
    if not _cgroups_mounted():
        return f"no cgroups mounted under {CGROUP_ROOT}"
    missing = [package for binary, package in PACKAGES.items() if shutil.which(binary) is None]
    if missing and shutil.which("apt-get") is None:
        return f"{', '.join(missing)} missing and no apt-get to install them"
    return None


def _cgroups_mounted() -> bool:
    return (CGROUP_ROOT / "cgroup.controllers").exists() or any(
        CGROUP_ROOT.glob("*/cgroup.procs"))


def run(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 600,
        check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """A command, its output captured; EngineError with its last lines if it fails."""
    result = subprocess.run(args, env=env, timeout=timeout, capture_output=True, text=True,
                            cwd=cwd)
    if check and result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-20:])
        raise EngineError(f"{' '.join(args[:4])} ... exited {result.returncode}:\n{tail}")
    return result


def install_missing() -> list[str]:
    """apt-get install the packages whose binaries are missing; the packages installed."""
    missing = [package for binary, package in PACKAGES.items() if shutil.which(binary) is None]
    if missing:
        log.info("installing %s", " ".join(missing))
        run(["apt-get", "update", "-qq"])
        # Recommends would bring apparmor, git, needrestart and cgroupfs-mount: not needed.
        with services_not_started():
            run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    return missing


POLICY_RC = Path("/usr/sbin/policy-rc.d")


@contextlib.contextmanager
def services_not_started() -> Iterator[None]:
    """No service starts while packages install: docker.io's own would start a dockerd
    with the default flags (IP forwarding on, NAT rules, docker0). Debian asks
    /usr/sbin/policy-rc.d; exit 101 forbids. A policy already there is left as it is."""
    if POLICY_RC.exists():
        yield
        return
    POLICY_RC.write_text("#!/bin/sh\nexit 101\n")
    POLICY_RC.chmod(0o755)
    try:
        yield
    finally:
        POLICY_RC.unlink(missing_ok=True)


def docker_config() -> Path:
    """Our DOCKER_CONFIG, with the compose v2 plugin in it (fetched once)."""
    config = CACHE / "docker-config"
    plugin = config / "cli-plugins" / "docker-compose"
    if not plugin.is_file():
        plugin.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as unpacked:
            deb = _download_from_suite("docker-compose", COMPOSE_SUITE)
            run(["dpkg-deb", "-x", str(deb), unpacked])
            found = next(Path(unpacked).glob("usr/*/docker/cli-plugins/docker-compose"))
            shutil.copy2(found, plugin)
    return config


def _download_from_suite(package: str, suite: str) -> Path:
    """The .deb of `package` in Debian `suite`, by an apt configuration of our own."""
    root = CACHE / "apt"
    (root / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (root / "archives").mkdir(parents=True, exist_ok=True)
    sources = root / "sources.list"
    sources.write_text("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
                       f"http://deb.debian.org/debian {suite} main\n")
    options = ["-o", f"Dir::Etc::SourceList={sources}", "-o", "Dir::Etc::SourceParts=/dev/null",
               "-o", f"Dir::State::Lists={root / 'lists'}", "-o", f"Dir::Cache={root}",
               "-o", "Dir::State::Status=/dev/null", "-o", "APT::Architecture=amd64"]
    run(["apt-get", *options, "update", "-qq"])
    run(["apt-get", *options, "download", package], cwd=root / "archives")
    return max((root / "archives").glob(f"{package}_*.deb"), key=lambda p: p.stat().st_mtime)


@contextlib.contextmanager
def private_engine(startup_timeout: float = 60.0) -> Iterator[Engine]:
    """A dockerd of our own for the block; stopped and cleaned up however it ends.

    EngineUnavailable when the machine cannot run one. One engine at a time uses the
    cache's data root (a lock file says so); another run waits for it.
    """
    reason = unavailable_reason()
    if reason is not None:
        raise EngineUnavailable(reason)
    install_missing()
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "engine.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        exec_root = Path(tempfile.mkdtemp(prefix="jobdist-docker-", dir="/run"))
        ours = [path for path in RUN_DIRS if not path.exists()]
        process = None
        try:
            process = _start_dockerd(exec_root)
            client = _wait_ready(process, exec_root, startup_timeout)
            env = {**os.environ, "DOCKER_HOST": f"unix://{exec_root / 'docker.sock'}",
                   "DOCKER_CONFIG": str(docker_config())}
            engine = Engine(client, process.pid, exec_root, env)
            try:
                yield engine
            finally:
                _kill_containers(client)
                client.close()
        finally:
            if process is not None:
                _stop(process)
            clean_up(exec_root, ours)


def _start_dockerd(exec_root: Path) -> subprocess.Popen[bytes]:
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise EngineError("dockerd is not installed (apt-get install docker.io)")
    with open(exec_root / "dockerd.log", "ab") as output:
        return subprocess.Popen(
            [dockerd, "--data-root", str(CACHE / "data"), "--exec-root", str(exec_root / "exec"),
             "--pidfile", str(exec_root / "docker.pid"),
             "-H", f"unix://{exec_root / 'docker.sock'}", *DOCKERD_FLAGS],
            stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True)


def _wait_ready(process: subprocess.Popen[bytes], exec_root: Path, timeout: float) -> Any:
    import docker  # type: ignore[import-untyped]  # the [test] extra's SDK, no types

    socket = exec_root / "docker.sock"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise EngineError(f"dockerd exited {process.returncode} at start:\n"
                              f"{_tail(exec_root / 'dockerd.log')}")
        if socket.exists():
            client = docker.DockerClient(base_url=f"unix://{socket}", timeout=120)
            with contextlib.suppress(docker.errors.DockerException):
                client.ping()
                return client
            client.close()
        time.sleep(0.2)
    raise EngineError(f"dockerd did not answer in {timeout:.0f} s:\n"
                      f"{_tail(exec_root / 'dockerd.log')}")


def _tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def _kill_containers(client: Any) -> None:
    """Kill what still runs: dockerd would otherwise stop each within its own timeout."""
    with contextlib.suppress(Exception):  # the engine may be gone already
        for container in client.containers.list():
            with contextlib.suppress(Exception):
                container.kill()


def _stop(process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM our dockerd (by its pid); SIGKILL its session if it does not stop."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            signal_group(process.pid, signal.SIGKILL)
            process.wait(timeout)


def clean_up(exec_root: Path, run_dirs: list[Path]) -> list[str]:
    """Remove what a stopped dockerd leaves: processes still naming its exec root (the
    containerd shims), mounts under its roots, its cgroups, `run_dirs` (those it made
    outside), the exec root itself. What could not be removed, logged and returned."""
    for pid in _processes_naming(exec_root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    left = _unmount_under((exec_root, CACHE / "data", *RUN_DIRS))
    for cgroup in [*CGROUP_ROOT.glob("*/docker"), CGROUP_ROOT / "docker"]:
        left += _remove_cgroup(cgroup)
    for directory in run_dirs:
        shutil.rmtree(directory, ignore_errors=True)
    shutil.rmtree(exec_root, ignore_errors=True)
    for item in left:
        log.warning("engine cleanup left %s", item)
    return left


def _processes_naming(exec_root: Path) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if str(exec_root).encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
    return [pid for pid in pids if pid != os.getpid()]


def _unmount_under(roots: tuple[Path, ...]) -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == str(root) or point.startswith(f"{root}/") for root in roots):
            points.append(point)
    left = []
    for point in sorted(points, key=len, reverse=True):  # the deepest first
        if subprocess.run(["umount", "--lazy", point], capture_output=True).returncode != 0:
            left.append(f"mount {point}")
    return left


def _remove_cgroup(cgroup: Path) -> list[str]:
    """rmdir a cgroup and its children, the deepest first (only empty ones can go)."""
    if not cgroup.is_dir():
        return []
    left = []
    children = sorted((p for p in cgroup.rglob("*") if p.is_dir()),
                      key=lambda p: len(p.parts), reverse=True)
    for directory in [*children, cgroup]:
        try:
            directory.rmdir()
        except OSError:
            left.append(f"cgroup {directory}")
    return left
