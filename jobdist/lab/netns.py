"""Sites as separate hosts: one Linux network namespace per site.

Each site's server and daemon run in a namespace of their own, with their own
loopback and one address on a bridge that joins the sites (and the test
runner, in the root namespace, which reaches every site's address). A daemon
reaches its CouchDB at the site's own address; another site's loopback is not
its loopback. A partition is the site's link taken down: every connection to
and from it stops, as a cable pulled would, with no proxy in the path.

The nearest a machine without a Docker engine gets to docker-compose's
multi-container sites. Needs root and `ip` (iproute2); `unavailable()` says why
not, for a test to skip with. Addresses are link-local (169.254.N.0/24, one N
per network, unused on this machine), never routed off it.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Sequence

from ..errors import JobdistError

PREFIX = "jd"  # names: jd<run>-br (bridge), jd<run>-<i> (host end of a link), jd<run>s<i> (netns)


class NetworkError(JobdistError, RuntimeError):
    """The namespaces could not be set up or torn down."""


def unavailable() -> str | None:
    """Why sites cannot run in namespaces here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need `ip` (iproute2)"
    probe = f"{PREFIX}probe{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
    except NetworkError as error:
        return f"cannot create a network namespace: {error}"
    with contextlib.suppress(NetworkError):
        _ip("netns", "del", probe)
    return None


class HostNetwork:
    """The namespaces of `names`, each with its own address on one bridge.

    A context manager: entering builds everything, leaving removes everything it
    built (the processes inside must be stopped first: LocalCluster.down).
    """

    def __init__(self, names: Sequence[str]) -> None:
        self.run = secrets.token_hex(2)  # concurrent runs on one machine never share names
        self.names = list(names)
        self.subnet = _free_subnet()
        self.addresses = {name: f"169.254.{self.subnet}.{i + 1}" for i, name in enumerate(names)}
        self.bridge = f"{PREFIX}{self.run}-br"
        self._built: list[list[str]] = []  # undo commands, newest last

    def namespace(self, name: str) -> str:
        return f"{PREFIX}{self.run}s{self.names.index(name)}"

    def link(self, name: str) -> str:
        """The root namespace's end of the site's link: down means cut off."""
        return f"{PREFIX}{self.run}-{self.names.index(name)}"

    def command(self, name: str, args: Sequence[str]) -> list[str]:
        """`args` run inside the site's namespace (`ip netns exec` execs: same pid)."""
        return ["ip", "netns", "exec", self.namespace(name), *args]

    def cut(self, name: str) -> None:
        _ip("link", "set", self.link(name), "down")

    def restore(self, name: str) -> None:
        _ip("link", "set", self.link(name), "up")

    def __enter__(self) -> HostNetwork:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        self._add(["link", "add", self.bridge, "type", "bridge"], ["link", "del", self.bridge])
        _ip("addr", "add", f"169.254.{self.subnet}.254/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for name in self.names:
            namespace, link = self.namespace(name), self.link(name)
            self._add(["netns", "add", namespace], ["netns", "del", namespace])
            # The site's end is created inside its namespace; deleting either end
            # deletes both, and deleting the namespace deletes its end.
            _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", namespace)
            _ip("link", "set", link, "master", self.bridge, "up")
            _ip("-n", namespace, "addr", "add", f"{self.addresses[name]}/24", "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "up")
            _ip("-n", namespace, "link", "set", "lo", "up")

    def _add(self, build: list[str], undo: list[str]) -> None:
        _ip(*build)
        self._built.append(undo)

    def close(self) -> None:
        """Remove what was built, newest first; keep going past what is already gone."""
        while self._built:
            with contextlib.suppress(NetworkError):
                _ip(*self._built.pop())


def _free_subnet() -> int:
    """A third octet N such that no interface here has an address in 169.254.N.0/24."""
    used = set(re.findall(r"inet 169\.254\.(\d+)\.", _ip("-o", "-4", "addr", "show")))
    free = [n for n in range(100, 250) if str(n) not in used]
    if free:  # at random: two runs starting at once rarely pick the same one
        return secrets.choice(free)
    raise NetworkError("no free 169.254.N.0/24 subnet for the sites")


def _ip(*args: str) -> str:
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise NetworkError(f"ip {' '.join(args)}: {error}") from None
    if done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout
