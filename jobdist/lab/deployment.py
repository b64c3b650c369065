"""Benchmark sites on an existing deployment: its servers, a database of the bench's own.

`DeploymentSites` is a LocalCluster whose servers are not ours: it derives a
site config from each of the deployment's (its server, its admin and site
credentials, its peers and replication settings), with the database swapped for
BENCH_DATABASE and the bench's own workers and timings; sets that database up
as `jobdist setup` does (setup.setup_sites: its design documents, `_security`
and replications, whose ids name it: topology.owned_prefix); and starts a
daemon per site on this machine. On the way out, whatever happened, it stops
those daemons by pid, then deletes the bench's replication documents and the
bench database on every server. The deployment's own database, documents and
replications are never read or written.

pouchdb-server crashes when a running replication's document is deleted, so
there the bench's replications are first made to fail: the bench database of
every site is closed to the site users (its `_security`), and a deletion written
at each site makes each replication push, be refused and stop for good.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

from ..config import ConfigError, SiteConfig, load_sites
from ..couch import CouchError, Saved
from ..errors import JobdistError
from ..model import new_job, new_step
from ..setup import (
    SAFE_TO_DELETE_ON_POUCHDB,
    admin_couch_of,
    kind_of,
    owned_replications,
    remove_replication,
    setup_sites,
)
from ..topology import ServerKind
from .cluster import ClusterError, LocalCluster
from .localserver import private_dir

BENCH_DATABASE = "jobdist_bench"
STOP_WAIT = 30.0  # seconds pouchdb-server's replications get to stop once refused
Say = Callable[[str], None]


class DeploymentError(JobdistError):
    """A deployment the bench cannot measure; the message says why."""


def load_deployment(directory: Path) -> dict[str, SiteConfig]:
    """The deployment's site configs; every one must name an admin (setup needs one)."""
    try:
        sites = load_sites(directory)
    except ConfigError as error:
        raise DeploymentError(f"--deployment: {error}") from None
    for site in sites.values():
        site.require_credentials()
        if site.couch.database == BENCH_DATABASE:
            raise DeploymentError(f"{site.path}: the deployment's database is "
                                  f"{BENCH_DATABASE}, the bench's own: the bench would "
                                  "remove it")
        if site.couch.admin_user is None:
            raise DeploymentError(f"{site.path}: no admin credentials "
                                  "(couch.admin_credentials or $JOBDIST_COUCH_ADMIN_USER): "
                                  "the bench creates and removes a database of its own")
    return sites


def server_versions(sites: Mapping[str, SiteConfig]) -> dict[str, str]:
    """Each site's server kind and version, as its `GET /` says."""
    versions = {}
    for name, site in sites.items():
        info = admin_couch_of(site, retries=1).info()
        kind = "Apache CouchDB" if "couchdb" in info else "pouchdb-server"
        versions[name] = f"{kind} {info.get('version', '(no version)')} at {site.couch.url}"
    return versions


def bench_site_config(site: SiteConfig, workers: int, keepalive: float) -> str:
    """The TOML of a bench site on `site`'s server: paths made absolute (the config is
    written elsewhere), no admin port (the deployment's daemon holds it), no command
    allow-list (the benches run `true`, `sleep` and shell lines)."""
    couch, replication = site.couch, site.replication
    logins = {"credentials": couch.credentials, "admin_credentials": couch.admin_credentials}
    lines = [f"name = {_text(site.name)}", f"workers = {workers}",
             f"peers = [{', '.join(map(_text, site.peers))}]", "",
             "[couch]", f"url = {_text(couch.url)}", f"database = {_text(BENCH_DATABASE)}"]
    lines += [f"{key} = {_text(str(path.resolve()))}" for key, path in logins.items() if path]
    if couch.credentials is None and couch.user:  # inline in the deployment's config
        lines += [f"user = {_text(couch.user)}", f"password = {_text(couch.password or '')}"]
    peer_urls = ", ".join(f"{peer} = {_text(url)}" for peer, url in
                          replication.peer_urls.items())
    lines += ["", "[replication]", f"filtered = {str(replication.filtered).lower()}",
              f"relay = {str(replication.relay).lower()}", f"peer_urls = {{ {peer_urls} }}",
              "", "[daemon]", "shutdown_grace = 2.0", "", "[tuning]",
              f"keepalive_period = {keepalive}"]
    return "\n".join(lines) + "\n"


def _text(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string


def write_bench_sites(deployment: Mapping[str, SiteConfig], directory: Path,
                      workers: Mapping[str, int], keepalive: float) -> Path:
    private_dir(directory)  # an inline password may be in them
    for name, site in deployment.items():
        (directory / f"{name}.toml").write_text(
            bench_site_config(site, workers[name], keepalive))
    return directory


def remove_bench_database(sites: Mapping[str, SiteConfig], warn: Say) -> None:
    """Delete the bench's replication documents, then the bench database, on every site's
    server; what would crash pouchdb-server is stopped first (module docstring), and a
    replication that still runs there is left, with a warning."""
    if any(site.couch.database != BENCH_DATABASE for site in sites.values()):
        raise ValueError("remove_bench_database is given the bench's sites only")
    present = {name: site for name, site in sites.items()
               if admin_couch_of(site).database(BENCH_DATABASE).exists()}
    pouchdb = {name: site for name, site in present.items()
               if kind_of(admin_couch_of(site)) is ServerKind.POUCHDB
               and owned_replications(admin_couch_of(site).replicator(), BENCH_DATABASE)}
    if pouchdb:
        stop_pouchdb_replications(pouchdb)
    for site in sites.values():
        couch = admin_couch_of(site)
        replicator = couch.replicator()
        for doc_id in owned_replications(replicator, BENCH_DATABASE):
            remove_replication(couch, replicator, doc_id, site, _ignore, warn, warn)
    for site in present.values():
        couch = admin_couch_of(site)
        couch.call(f"delete {BENCH_DATABASE}", couch.client.delete_database, BENCH_DATABASE)


def stop_pouchdb_replications(sites: Mapping[str, SiteConfig]) -> None:
    """Close each bench database to the site users, then write a deletion at each site: its
    replications push it, are refused (a fatal error to pouchdb's replicator) and stop."""
    closed = {"admins": {"names": [], "roles": []},
              "members": {"names": [], "roles": ["_admin"]}}
    for site in sites.values():
        admin_couch_of(site).database(BENCH_DATABASE).put_security(closed)
    for site in sites.values():  # (a job: the database's validation accepts it)
        db = admin_couch_of(site).database(BENCH_DATABASE)
        job = new_job(site.name, [new_step("true")])
        saved = db.save(job)
        if isinstance(saved, Saved):
            db.delete(job["_id"], saved.rev)
    deadline = time.monotonic() + STOP_WAIT
    for site in sites.values():
        replicator = admin_couch_of(site).replicator()
        for doc_id in owned_replications(replicator, BENCH_DATABASE):
            while (replicator.get(doc_id) or {}).get("_replication_state") \
                    not in SAFE_TO_DELETE_ON_POUCHDB and time.monotonic() < deadline:
                time.sleep(0.1)


class DeploymentSites(LocalCluster):
    """A deployment's servers with the bench's database and daemons (module docstring)."""

    def __init__(self, deployment_dir: Path, state_dir: Path,
                 workers: int | Mapping[str, int], keepalive: float = 5.0) -> None:
        self.deployment_dir = Path(deployment_dir)
        self.deployment = load_deployment(self.deployment_dir)
        per_site = workers if isinstance(workers, Mapping) else dict.fromkeys(
            self.deployment, workers)
        sites_dir = write_bench_sites(self.deployment, Path(state_dir) / "sites", per_site,
                                      keepalive)
        super().__init__(sites_dir, Path(state_dir) / "state")

    def up(self, timeout: float = 60.0) -> list[str]:
        private_dir(self.state_dir)
        state: dict[str, Any] = {"sites_dir": str(self.sites_dir.resolve()), "sites": {}}
        self._save(state)
        try:
            remove_bench_database(self.sites, _warn)  # what an interrupted run left
            setup_sites(self.sites)
            for site in self.sites.values():
                self.site_dir(site.name).mkdir(parents=True, exist_ok=True)
                self._record(site.name, "daemon", self._start_daemon(site))
            self._wait_ready(timeout)
            self._wait_connected(timeout)
        except BaseException:
            self.down()
            raise
        return [f"{name} daemon" for name in self.sites]

    def down(self) -> list[str]:
        """Stop the bench's daemons, then remove its replications and database."""
        try:
            return super().down()
        finally:
            try:
                remove_bench_database(self.sites, _warn)
            except CouchError as error:  # never hides what ended the run
                click.echo(f"jobdist: the bench database {BENCH_DATABASE} or its "
                           f"replications may be left on the deployment: {error}", err=True)

    def server_pid(self, name: str) -> int:
        raise ClusterError(f"the server of site {name} is the deployment's: not ours to watch")


def _ignore(_: str) -> None:
    pass


def _warn(line: str) -> None:
    click.echo(f"jobdist: {line}", err=True)
