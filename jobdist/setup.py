"""Setting sites up: databases, design documents, users, `_security`, replications.

Used by `jobdist setup`, the local cluster and docker-compose's one-shot setup
service (`python -m jobdist.setup --sites DIR`), logged in as the server admin
(`admin_credentials`) where a site has one. Each site gets its jobs database, our
design documents, a user for every site (role `jobdist`, which alone may read and
write the database: the site's daemon and the replications it pushes log in as
it), and the `_replicator` documents the topology calls for (topology.py), stale
ones of the same database removed. Idempotent: a second run changes nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import click

from .config import ConfigError, SiteConfig, load_sites
from .couch import Couch, CouchError, Database, Forbidden, Saved
from .couch_sync import put_replication, sync_design_docs
from .design import DESIGN_VERSION, load_design_docs
from .model import Doc
from .topology import (
    JOBS_DATABASE,
    Replication,
    ServerKind,
    full_mesh_warning,
    owned_prefix,
    replication_doc,
    replications,
)

Say = Callable[[str], None]

# Replication states in which pouchdb-server's replicator no longer reads the document.
SAFE_TO_DELETE_ON_POUCHDB = ("completed", "error", "failed")


SITE_ROLE = "jobdist"


def couch_of(site: SiteConfig, **options: Any) -> Couch:
    """The site's server as the site's own user (what the daemon and the CLI use)."""
    return Couch(site.couch.url, user=site.couch.user, password=site.couch.password,
                 site=site.name, **options)


def admin_couch_of(site: SiteConfig, **options: Any) -> Couch:
    """The site's server as its admin, where the config names one; else as the site."""
    if site.couch.admin_user is None:
        return couch_of(site, **options)
    return Couch(site.couch.url, user=site.couch.admin_user, password=site.couch.admin_password,
                 site=site.name, **options)


def security_object(site: SiteConfig) -> dict[str, Any]:
    """Only the admin administers the jobs database; only site users read and write it."""
    admins = [site.couch.admin_user] if site.couch.admin_user else []
    return {"admins": {"names": admins, "roles": []},
            "members": {"names": [], "roles": [SITE_ROLE]}}


def setup_sites(sites: dict[str, SiteConfig], chosen: list[SiteConfig] | None = None, *,
                report: Say = lambda _: None, problem: Say | None = None,
                warn: Say | None = None,
                explain: Callable[[CouchError, SiteConfig], str] | None = None,
                server_kind: ServerKind | None = None) -> int:
    """Set the chosen sites (default: all) up; the number of changes made.

    `server_kind` decides what the replication documents hold; by default each
    server's `GET /` does.

    Without `problem`, the first error raises; with it, each site's error is
    reported (in `explain`'s words) and the other sites are still set up.
    `warn` (default: `report`) hears of what was left alone on purpose.
    """
    explain = explain or (lambda error, site: f"{site.name}: {error}")
    warn = warn or report
    for site in sites.values():  # every site's user is created and used by replications
        site.require_credentials()
    warning = full_mesh_warning(sites)
    if warning is not None:
        warn(warning)
    changes = 0

    def each(group: Iterable[SiteConfig], work: Callable[[SiteConfig], int]) -> list[SiteConfig]:
        """Count the changes `work` makes at each site; the sites it did not fail at."""
        nonlocal changes
        done = []
        for site in group:
            try:
                changes += work(site)
                done.append(site)
            except CouchError as error:
                if problem is None:
                    raise
                problem(explain(error, site))
        return done

    # Every site's user and password: each must exist on every server.
    logins = {site.couch.user: site.couch.password or "" for site in sites.values()
              if site.couch.user}
    wanted = replications(sites)
    # Every database first: replications target them.
    ready = each(chosen or sites.values(), lambda site: setup_database(site, report, logins))
    each(ready, lambda site: sync_replications(
        site, [r for r in wanted if r.source.name == site.name], {r.doc_id for r in wanted},
        report, problem or _raise, warn, server_kind))
    return changes


def setup_database(site: SiteConfig, report: Say, logins: dict[str, str] | None = None) -> int:
    """The site's jobs database, design documents, users and `_security`; changes made."""
    couch = admin_couch_of(site)
    changes = 0
    # Apache CouchDB logs errors without `_users`.
    if couch.is_apache_couchdb() and not couch.database("_users").exists():
        couch.ensure_database("_users")
        changes += 1
        report(f"{site.name}: created database _users")
    db = couch.database(site.couch.database)
    if not db.exists():
        couch.ensure_database(site.couch.database)
        changes += 1
        report(f"{site.name}: created database {site.couch.database}")
    def left_newer(doc_id: str, version: int) -> None:
        report(f"{site.name}: left {doc_id} as it is: its version {version} is newer than "
               f"this jobdist's ({DESIGN_VERSION}); upgrade jobdist at this site")

    written = sync_design_docs(db, load_design_docs(), left_newer)
    for doc_id in written:
        changes += 1
        report(f"{site.name}: wrote {doc_id}")
    if written:
        db.view_cleanup()  # the replaced views' indexes would stay on disk
    if site.couch.admin_user is not None:  # without an admin there is no one to lock out
        for user, password in sorted((logins or {}).items()):
            if ensure_user(couch, site, user, password):
                changes += 1
                report(f"{site.name}: wrote user {user}")
        if db.security() != security_object(site):
            db.put_security(security_object(site))
            changes += 1
            report(f"{site.name}: wrote _security of {site.couch.database}")
    couch.replicator()
    return changes


def ensure_user(couch: Couch, site: SiteConfig, user: str, password: str) -> bool:
    """Create the user, or set its password if that no longer logs in; True on a write."""
    if Couch(site.couch.url, user=user, password=password, retries=1).session_user() == user:
        return False
    users = couch.database("_users")
    doc_id = f"org.couchdb.user:{user}"
    current = users.get(doc_id) or {}
    doc = {**current, "_id": doc_id, "name": user, "password": password,
           "roles": [SITE_ROLE], "type": "user"}
    users.save(doc)
    return True


def check_database(site: SiteConfig) -> None:
    """For a daemon without admin rights: the database must have been set up already."""
    db = couch_of(site).database(site.couch.database)
    missing = [doc["_id"] for doc in load_design_docs() if db.get(doc["_id"]) is None]
    if missing:
        raise CouchError(f"{site.name}: the database {site.couch.database} is not set up "
                         f"({', '.join(missing)} missing): run `jobdist setup`")


def sync_replications(site: SiteConfig, wanted: list[Replication], keep: set[str],
                      report: Say, problem: Say, warn: Say,
                      server_kind: ServerKind | None = None) -> int:
    """Write the site's wanted replications, remove stale ones; the number of changes.

    `keep` holds every wanted replication of the topology: sites that share a
    server share its `_replicator` database, so only what no site wants is stale.
    """
    couch = admin_couch_of(site)
    replicator = couch.replicator()
    found = kind_of(couch)
    if server_kind is ServerKind.POUCHDB and found is ServerKind.COUCHDB:
        # Its replication documents name the source database by name, which CouchDB's
        # replicator refuses: every one would fail on the server.
        raise CouchError(f"{site.name}: told pouchdb-server, but GET / says Apache CouchDB")
    kind = server_kind or found
    changes = 0
    for link in wanted:
        try:
            written = put_replication(replicator, link.doc_id, replication_doc(link, kind))
        except Forbidden as error:
            # pouchdb-server refuses edits to a running replication (see couch_sync.py).
            problem(f"{site.name}: cannot update replication {link.doc_id}: {error.reason}")
            continue
        if written:
            changes += 1
            rule = f"selector as {link.filter}" if kind is ServerKind.COUCHDB else link.filter
            report(f"{site.name}: wrote replication {link.doc_id} ({rule})")
    for doc_id in sorted(set(owned_replications(replicator, site.couch.database)) - keep):
        if remove_replication(couch, replicator, doc_id, site, report, problem, warn):
            changes += 1
    return changes


def owned_replications(replicator: Database, database: str) -> list[str]:
    """The ids of the replication documents of `database`: those with its prefix
    (topology.owned_prefix), and `jobdist-` ones that push it (every database's ids
    before ids named the database: its setup takes them over)."""
    own, legacy = owned_prefix(database), owned_prefix(JOBS_DATABASE)
    rows = replicator.all_docs(startkey="jobdist", endkey="jobdist\ufff0", include_docs=True)
    return [row["id"] for row in rows
            if (row["id"].startswith(own) and own != legacy)
            or (row["id"].startswith(legacy) and pushed_database(row.get("doc")) == database)]


def pushed_database(doc: Doc | None) -> str:
    """The source database's name of a replication document (a name or a URL)."""
    return unquote(str((doc or {}).get("source", "")).rpartition("/")[2])


def kind_of(couch: Couch) -> ServerKind:
    return ServerKind.COUCHDB if couch.is_apache_couchdb() else ServerKind.POUCHDB


def remove_replication(couch: Couch, replicator: Database, doc_id: str, site: SiteConfig,
                       report: Say, problem: Say, warn: Say) -> bool:
    """Delete a stale replication document, unless that would crash pouchdb-server.

    pouchdb-server crashes when a running (`triggered`) replication's document
    is deleted (its replicator reads the deleted document back); one that
    completed or failed is no longer running and is safe to delete.
    """
    for _ in range(3):
        doc = replicator.get(doc_id)
        if doc is None:
            return False
        state = doc.get("_replication_state")
        if not couch.is_apache_couchdb() and state not in SAFE_TO_DELETE_ON_POUCHDB:
            warn(f"{site.name}: stale replication {doc_id} left in place: pouchdb-server "
                 "crashes when a running replication is deleted (restart the site with a "
                 "fresh server to drop it)")
            return False
        if isinstance(replicator.delete(doc_id, doc["_rev"]), Saved):
            report(f"{site.name}: removed stale replication {doc_id}")
            return True
    problem(f"{site.name}: cannot remove replication {doc_id}: it keeps changing")
    return False


def wait_for_servers(sites: dict[str, SiteConfig], timeout: float) -> None:
    """Return once every site's server answers; CouchError naming the first that does not."""
    deadline = time.monotonic() + timeout
    for site in sites.values():
        couch = admin_couch_of(site, timeout=5.0, retries=1)
        while True:
            try:
                couch.info()
                break
            except CouchError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)


def _raise(text: str) -> None:
    raise CouchError(text)


@click.command()
@click.option("--sites", "sites_dir", required=True, type=click.Path(path_type=Path),
              help="Directory of site configs (*.toml).")
@click.option("--timeout", default=120.0, show_default=True,
              help="Seconds to wait for the servers to answer.")
def main(sites_dir: Path, timeout: float) -> None:
    """Create databases, design documents and replications for every site; idempotent."""
    try:
        sites = load_sites(sites_dir)
        wait_for_servers(sites, timeout)
        changes = setup_sites(sites, report=click.echo)
    except (ConfigError, CouchError) as error:
        click.echo(f"jobdist setup: {error}", err=True)
        sys.exit(2)
    click.echo(f"setup done: {changes} changes")


if __name__ == "__main__":
    main()
