"""Commands about sites: run a site's daemon, set sites up, write their secrets,
remove old jobs."""

from __future__ import annotations

import sys
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import click

from jobdist.clock import parse_duration
from jobdist.config import SiteConfig, ensure_credentials, load_site, load_sites
from jobdist.couch import CouchError, Database
from jobdist.render import explain_couch_error, short_time
from jobdist.retention import cleanup as run_cleanup

from .common import EXIT_JOB_NOT_OK, CliError, at_site, load_site_configs, pick_site, sites_option


@click.group()
def site() -> None:
    """Run a site daemon."""


@site.command("run")
@click.option("--config", "config_path", required=True, type=click.Path(path_type=Path),
              help="The site's config file, e.g. sites/global.toml.")
@click.option("--sites", "sites_dir", type=click.Path(path_type=Path),
              help="All sites' configs (default: the config's directory), to know the sites.")
@click.option("--ready-file", type=click.Path(path_type=Path), help="Touched once ready.")
@click.option("--log-file", type=click.Path(path_type=Path), help="Log here, not stderr.")
@click.option("--log-level", default="INFO", show_default=True)
@click.option("--journal", type=click.Path(path_type=Path),
              help="Keep results CouchDB did not take in DIR/SITE (default: [daemon] "
                   "journal).")
def site_run(config_path: Path, sites_dir: Path | None, ready_file: Path | None,
             log_file: Path | None, log_level: str, journal: Path | None) -> None:
    """Run the daemon of one site until SIGTERM or SIGINT."""
    from jobdist.daemon import Daemon
    from jobdist.logs import configure_logging

    configure_logging(log_level.upper(), log_file)  # first: loading may warn (config.py)
    config = load_site(config_path)
    if journal is not None:
        config = replace(config, daemon=replace(config.daemon, journal=journal))
    known = set(load_sites(sites_dir or config_path.parent))
    sys.exit(Daemon(config, known).run(ready_file))


# --- setup -------------------------------------------------------------------------------


@click.command()
@sites_option
@click.option("--site", "only", multiple=True, metavar="SITE",
              help="Set up only this site (repeatable; default: every site).")
@click.option("--server-kind", type=click.Choice(["auto", "couchdb", "pouchdb"]),
              default="auto", show_default=True,
              help="The servers' kind, which decides the replication documents (a Mango "
                   "selector on couchdb, a JavaScript filter on pouchdb); auto asks each "
                   "server (GET /).")
def setup(sites_dir: Path, only: tuple[str, ...], server_kind: str) -> None:
    """Create each site's database, upload its design documents, and write the
    replications the topology needs; remove stale `jobdist-*` replications.
    Idempotent: a second run changes nothing."""
    from jobdist.setup import setup_sites
    from jobdist.topology import ServerKind

    sites = load_site_configs(sites_dir)
    chosen = [pick_site(sites, name) for name in only] if only else list(sites.values())
    problems = []

    def problem(text: str) -> None:
        problems.append(text)
        click.echo(f"jobdist: {text}", err=True)

    changes = setup_sites(sites, chosen, report=click.echo, problem=problem,
                          warn=lambda text: click.echo(f"jobdist: {text}", err=True),
                          explain=site_error,
                          server_kind=None if server_kind == "auto" else ServerKind(server_kind))
    if problems:
        sys.exit(EXIT_JOB_NOT_OK)
    click.echo(f"setup: {changes} changes" if changes else "setup: nothing to change")


@click.command()
@sites_option
@click.option("--compose-env", "compose_env", type=click.Path(path_type=Path),
              help="Also write docker-compose's variables (passwords, admin token) to this "
                   "env file, e.g. .env.")
def secrets(sites_dir: Path, compose_env: Path | None) -> None:
    """Write the credentials and admin token files the site configs name and nobody
    has written yet (random secrets, mode 600); existing ones are kept. `jobdist
    cluster up` does this by itself."""
    sites = load_site_configs(sites_dir)
    missing = [path for site in sites.values()
               for path in (site.couch.credentials, site.couch.admin_credentials,
                            site.admin.token_file)
               if path is not None and not path.exists()]
    ensure_credentials(sites, sites_dir)
    for path in dict.fromkeys(missing):
        click.echo(f"wrote {path}")
    if compose_env is not None:
        write_compose_env(compose_env, list(sites))
        click.echo(f"wrote {compose_env}")
    if not missing and compose_env is None:
        click.echo("secrets: nothing to write")


def write_compose_env(path: Path, site_names: list[str]) -> None:
    """docker-compose's secrets as an env file only its owner reads; never overwritten."""
    import os
    import secrets as random_secrets

    if path.exists():
        raise CliError(f"{path} exists already: it holds the deployment's secrets, "
                       "and new ones would lock the sites out")
    names = ["COUCHDB_PASSWORD", "JOBDIST_ADMIN_TOKEN",
             *(f"JOBDIST_PASSWORD_{name.upper()}" for name in site_names)]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.writelines(f"{name}={random_secrets.token_urlsafe(24)}\n" for name in names)


def site_error(error: CouchError, site: SiteConfig) -> str:
    text = explain_couch_error(error, site)
    return text if f"site {site.name} " in text else f"{site.name}: {text}"


# --- cleanup -----------------------------------------------------------------------------


@click.command()
@click.option("--older-than", "older_than", required=True, metavar="PERIOD",
              help="Remove finished jobs last updated longer ago than this: 90m, 12h, 30d, 2w.")
@click.option("--export", "export_path", type=click.Path(path_type=Path, dir_okay=False),
              help="First append each job (merged, one JSON object a line) to this file; "
                   "only exported jobs are removed.")
@click.option("--dry-run", is_flag=True, help="Count what would be removed; change nothing "
                                              "(and export nothing).")
@at_site
def cleanup(older_than: str, export_path: Path | None, dry_run: bool, site: SiteConfig,
            db: Database) -> None:
    """Remove finished jobs (success, failed, cancelled) past a retention period.

    Deletes every revision of each such job at the site; replication carries
    the deletions to the other sites.
    """
    period = parse_duration(older_than)
    try:  # a batch is deleted only once its export is written and synced (retention.py)
        with (export_path.open("a", encoding="utf-8") if export_path and not dry_run
              else nullcontext()) as export:
            report = run_cleanup(db, period, export=export, dry_run=dry_run)
    except OSError as error:
        raise CliError(f"{export_path}: cannot write: {error.strerror or error}") from None
    when = short_time(report.cutoff)
    if dry_run:
        click.echo(f"would remove {report.found} finished jobs last updated before {when} UTC "
                   f"at site {site.name} (dry run: nothing changed)")
        return
    deleted = report.deleted
    if export_path is not None:
        click.echo(f"exported {report.exported} jobs to {export_path}")
    click.echo(f"removed {deleted.jobs} of {report.found} finished jobs last updated before "
               f"{when} UTC at site {site.name} ({deleted.revisions} revisions)")
    if deleted.changed:
        click.echo(f"kept {len(deleted.changed)} jobs changed since they were read: "
                   f"{', '.join(deleted.changed)}")
    if deleted.refused:
        for line in deleted.refused:
            click.echo(f"jobdist: refused: {line}", err=True)
        sys.exit(EXIT_JOB_NOT_OK)
