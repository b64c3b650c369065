"""The `jobdist bench` group and what every benchmark shares: fresh local sites
(on disk unless `--in-memory`) or a deployment's servers (`--deployment DIR`:
jobdist.lab.deployment), process CPU and memory, servers' request logs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import requests

from ..cluster import LocalCluster
from ..deployment import DeploymentError, DeploymentSites, load_deployment, server_versions
from ..scenarios import (
    write_sites,
)

TOPOLOGIES = ("mesh", "star", "filtered")


REPLICATOR_AGENT = "node-fetch"  # pouchdb-server's replicator; our daemons send python-requests


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")




@dataclass(frozen=True)
class BenchOptions:
    in_memory: bool = False  # servers that keep nothing on disk: no user runs them so
    deployment: Path | None = None  # measure these sites' servers, not fresh local ones


# Why each benchmark that cannot measure a deployment cannot.
LOCAL_ONLY = {
    "feed": "it compares two change followers on a fresh server of its own, with no sites",
    "memory": "it restarts one daemon on a fresh one-site server filled with 10,000 jobs",
    "replication": "it counts requests in the debug log pouchdb-server writes on this disk",
    "soak": "its faults kill and cut off the servers",
    "targets": "its request and memory targets need fresh local servers",
}


@click.group("bench")
@click.option("--in-memory", is_flag=True,
              help="Servers keep nothing on disk (the default is on disk, as users run them).")
@click.option("--deployment", type=click.Path(path_type=Path), metavar="DIR",
              help="Measure the servers of these site configs (admin credentials needed) "
                   "in a database of the bench's own: throughput, thesis, priorities.")
@click.pass_context
def bench(ctx: click.Context, in_memory: bool, deployment: Path | None) -> None:
    """Benchmarks against the thesis's figures and the local server's own limits."""
    if deployment is not None:
        command = ctx.invoked_subcommand
        if in_memory:
            raise DeploymentError("--in-memory and --deployment: a deployment's servers "
                                  "keep what they keep; give one of them")
        if command in LOCAL_ONLY:
            raise DeploymentError(f"bench {command} cannot measure a deployment: "
                                  f"{LOCAL_ONLY[command]}")
        load_deployment(deployment)  # a bad directory or config: said before anything runs
    ctx.obj = BenchOptions(in_memory, deployment)


def options() -> BenchOptions:
    """The bench group's options (the defaults outside a `jobdist bench` command)."""
    ctx = click.get_current_context(silent=True)
    found = ctx.find_object(BenchOptions) if ctx is not None else None
    return found or BenchOptions()


def in_memory() -> bool:
    """Were in-memory servers asked for (`jobdist bench --in-memory`)?"""
    return options().in_memory


def deployment() -> Path | None:
    """The deployment to measure (`jobdist bench --deployment DIR`), if any."""
    return options().deployment


def servers_kind() -> str:
    """What every report says of the servers it measured: with a deployment, each
    site's server kind and version (its `GET /`)."""
    directory = deployment()
    if directory is None:
        return "pouchdb-server " + ("in memory" if in_memory() else "on disk")
    versions = server_versions(load_deployment(directory))
    return f"deployment {directory}: " + "; ".join(
        f"{name} {version}" for name, version in versions.items())


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile: a value that was really measured."""
    ordered = sorted(values)
    rank = max(1, round(pct / 100 * len(ordered) + 0.5 - 1e-9))
    return ordered[min(rank, len(ordered)) - 1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak) of a live process, in KiB."""
    wanted = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            wanted[key] = int(value.split()[0])
    return wanted


def cluster_pids(cluster: LocalCluster) -> dict[str, list[int]]:
    """The pids of the pouchdb-servers (not their supervisors) and of the daemons; a
    deployment's servers are not ours to watch (none)."""
    daemons = [cluster.daemon_proc(name).pid for name in cluster.sites]
    if isinstance(cluster, DeploymentSites):
        return {"daemon": daemons}
    return {"server": [cluster.server_pid(name) for name in cluster.sites], "daemon": daemons}


def write_site_configs(directory: Path, count: int, workers: int,
                       topology: str = "mesh", keepalive: float = 5.0) -> Path:
    """write_sites for a benchmark: its topology and keep-alive period."""
    return write_sites(directory, count, workers, keepalive, topology=topology)


@contextlib.contextmanager
def local_cluster(count: int, workers: int, topology: str = "mesh",
                  keepalive: float = 5.0) -> Iterator[LocalCluster]:
    """Fresh sites in a temporary directory, always stopped afterwards; with
    `--deployment`, the deployment's sites instead (their count and topology)."""
    with tempfile.TemporaryDirectory(prefix="jobdist-bench-") as tmp:
        root = Path(tmp)
        directory = deployment()
        if directory is not None:
            with DeploymentSites(directory, root, workers, keepalive) as sites:
                yield sites
            return
        sites_dir = write_site_configs(root / "sites", count, workers, topology, keepalive)
        with LocalCluster(sites_dir, root / "state", in_memory=in_memory()) as cluster:
            yield cluster


def print_json(payload: Any) -> None:
    click.echo(json.dumps(payload, indent=2))


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    agent: str
    body_bytes: int


# A debug entry: "[date] [debug] [<pid>] 'POST' /jobs/_bulk_docs {1,1} from "ip"", then
# "Headers: [{'Name', value},", one header a line, no closing bracket; the next entry
# starts with "[Sun, 22 Nov ...".
_DEBUG_ENTRY = re.compile(r"\[debug\] \[<[^>]*>\] '(\w+)' (\S+) \{1,1\} from [^\n]*\n"
                          r"Headers: \[(.*?)\n(?=\[\w{3}, |\Z)", re.DOTALL)


_HEADER = re.compile(r"\{'([^']+)', ([^}]*)\}")


class ServerLog:
    """pouchdb-server's log.txt at debug level: one entry per request, headers included.

    The User-Agent tells the replicator (node-fetch) from our daemons
    (python-requests); Content-Length is the request body. Responses are
    not logged, so `_changes` and `_bulk_get` answers are not in the bytes.
    """

    def __init__(self, server_url: str, path: Path,
                 admin: tuple[str, str] | None = None) -> None:
        self.path = path
        requests.put(f"{server_url}/_config/log/level", json="debug", auth=admin,
                     timeout=10).raise_for_status()
        self.offset = path.stat().st_size if path.exists() else 0

    def requests_since_start(self) -> list[Request]:
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            return parse_requests(handle.read().decode("utf-8", errors="replace"))


def parse_requests(text: str) -> list[Request]:
    found = []
    for method, path, headers in _DEBUG_ENTRY.findall(text):
        fields = {k.lower(): v.strip() for k, v in _HEADER.findall(headers)}
        length = fields.get("content-length", "0")
        found.append(Request(method, path, fields.get("user-agent", ""),
                             int(length) if length.isdigit() else 0))
    return found


def request_kind(request: Request) -> str:
    """Who sent a request and what it was, with document ids and checkpoints folded."""
    # Everything not the replicator is python-requests: the daemons and the bench's own polls.
    who = "replicator" if request.agent.startswith(REPLICATOR_AGENT) else "jobdist"
    path, _, query = request.path.partition("?")
    parts = path.split("/")
    if len(parts) > 2 and not parts[2].startswith("_"):
        parts[2] = "{doc}" + (" open_revs" if "open_revs" in query else "")
    elif len(parts) > 3 and parts[2] == "_local":
        parts[3:] = ["{local}"]
    elif parts[-1] == "_changes":
        feed = re.search(r"feed=(\w+)", query)
        parts[-1] += f" feed={feed.group(1) if feed else 'normal'}"
    return f"{who} {request.method} {'/'.join(parts)}"


def request_census(logs: list[ServerLog]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for log in logs:
        for request in log.requests_since_start():
            kind = request_kind(request)
            counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


sites_option = click.option("--sites", default=3, show_default=True, type=click.IntRange(min=1),
                            help="Sites.")


topology_option = click.option(
    "--topology", type=click.Choice(TOPOLOGIES), default="mesh", show_default=True,
    help="mesh: every pair replicates; star: global the hub, filtered to the spokes; "
         "filtered: a mesh pushing each peer only what concerns it.")


json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print machine-readable results.")


def workers_option(default: int) -> Any:
    return click.option("--workers", default=default, show_default=True,
                        type=click.IntRange(min=1), help="Workers a site.")


def timeout_option(default: float) -> Any:
    return click.option("--timeout", default=default, show_default=True,
                        help="Seconds to wait for jobs.")
