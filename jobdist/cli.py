"""The `jobdist` command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from jobdist.cluster import DEFAULT_STATE_DIR, ClusterError, LocalCluster
from jobdist.config import ConfigError, SiteConfig, load_site, load_sites
from jobdist.couch import Couch, CouchError, Database
from jobdist.localserver import ServerError
from jobdist.model import job_from_submission
from jobdist.validation import format_errors, validate_job, validate_submission

# Exit codes of `validate`: 1 when the job breaks rules, 2 when it cannot be read.
EXIT_INVALID = 1
EXIT_UNREADABLE = 2


class Cli(click.Group):
    """Errors people meet are one clear line and exit 2, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (ConfigError, CouchError, ClusterError, ServerError, UnreadableFile) as error:
            click.echo(f"jobdist: {error}", err=True)
            sys.exit(EXIT_UNREADABLE)


@click.group(cls=Cli)
def main() -> None:
    """A multi-site job distributor on replicated CouchDB."""


sites_option = click.option("--sites", "sites_dir", default="sites", show_default=True,
                            type=click.Path(path_type=Path), help="Directory of site configs.")
state_option = click.option("--state", "state_dir", default=str(DEFAULT_STATE_DIR),
                            show_default=True, type=click.Path(path_type=Path),
                            help="Where the local cluster keeps pids and logs.")
site_option = click.option("--site", "site_name", default="global", show_default=True,
                           help="The site whose CouchDB to talk to (the job's creator).")


def open_site(sites_dir: Path, name: str) -> tuple[SiteConfig, Database]:
    sites = load_sites(sites_dir)
    if name not in sites:
        raise ConfigError(f"unknown site {name!r}; known: {', '.join(sorted(sites))}")
    site = sites[name]
    couch = Couch(site.couch_url, user=site.user, password=site.password)
    return site, couch.database(site.database)


@main.group()
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
def site_run(config_path: Path, sites_dir: Path | None, ready_file: Path | None,
             log_file: Path | None, log_level: str) -> None:
    """Run the daemon of one site until SIGTERM or SIGINT."""
    from jobdist.daemon import Daemon, configure_logging

    config = load_site(config_path)
    known = set(load_sites(sites_dir or config_path.parent))
    configure_logging(log_level.upper(), log_file)
    sys.exit(Daemon(config, known).run(ready_file))


@main.group()
def cluster() -> None:
    """A local cluster: a server and a daemon for every site of a sites directory."""


@cluster.command("up")
@sites_option
@state_option
@click.option("--in-memory", is_flag=True, help="Servers keep nothing on disk.")
def cluster_up(sites_dir: Path, state_dir: Path, in_memory: bool) -> None:
    """Start every site and continuous replication; return once all are ready."""
    local = LocalCluster(sites_dir, state_dir, in_memory=in_memory)
    local.up()
    for row in local.status():
        click.echo(f"{row['site']:<10} {row['url']:<26} fauxton {row['fauxton']}")


@cluster.command("down")
@sites_option
@state_option
def cluster_down(sites_dir: Path, state_dir: Path) -> None:
    """Stop exactly the processes `cluster up` started."""
    for line in LocalCluster(sites_dir, state_dir).down():
        click.echo(f"stopped {line}")


@cluster.command("status")
@sites_option
@state_option
def cluster_status(sites_dir: Path, state_dir: Path) -> None:
    """Show each site's server and daemon."""
    for row in LocalCluster(sites_dir, state_dir).status():
        click.echo(f"{row['site']:<10} server {row['server']:<22} daemon {row['daemon']:<22} "
                   f"{row['fauxton']}")


@main.command()
@click.argument("file")
@sites_option
@site_option
def submit(file: str, sites_dir: Path, site_name: str) -> None:
    """Submit the job in FILE (JSON, `-` for stdin) at a site; print its id."""
    submission = read_json(file)
    errors = validate_submission(submission)
    if errors:
        raise UnreadableFile(format_errors(errors))
    site, db = open_site(sites_dir, site_name)
    job = job_from_submission(submission, site.name)
    errors = validate_job(job)
    if errors:
        raise UnreadableFile(format_errors(errors))
    db.save(job)
    click.echo(job["_id"])


@main.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the whole document.")
@sites_option
@site_option
def show(job_id: str, as_json: bool, sites_dir: Path, site_name: str) -> None:
    """Show a job as the given site sees it."""
    _, db = open_site(sites_dir, site_name)
    doc = db.get(job_id, conflicts=True)
    if doc is None:
        raise UnreadableFile(f"no job {job_id!r} at site {site_name}")
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"{doc['_id']}  creator {doc['creator']}  status {doc['job_status'] or 'live'}"
               f"  step {doc['step']}/{len(doc['job'])}  rev {doc['_rev']}")
    for index, step in enumerate(doc["job"]):
        click.echo(f"  [{index}] {step.get('step_status') or '-':<9} "
                   f"target {step['target']!s:<14} ran on {step.get('winner') or '-':<8} "
                   f"{step['do']}")


@main.command()
@click.option("--step-seconds", default=0.5, show_default=True,
              help="How long each step sleeps (the thesis used 5).")
@click.option("--only", multiple=True, help="Run only scenarios whose name starts so.")
def demo(step_seconds: float, only: tuple[str, ...]) -> None:
    """Run the thesis's four evaluation scenarios on local clusters; print a table."""
    from jobdist.demo import run_demo

    sys.exit(run_demo(step_seconds, only))


@main.command()
@click.argument("file")
def validate(file: str) -> None:
    """Check the job in FILE (JSON, `-` for stdin) as it would be stored."""
    name = "<stdin>" if file == "-" else file
    try:
        doc = read_json(file)
    except UnreadableFile as problem:
        click.echo(f"{name}: {problem}", err=True)
        sys.exit(EXIT_UNREADABLE)
    errors = validate_submission(doc)
    for error in errors:
        click.echo(f"{name}: {error}")
    if errors:
        sys.exit(EXIT_INVALID)
    click.echo(f"{name}: ok")


class UnreadableFile(Exception):
    """The file is missing, unreadable or not JSON; the message says which."""


def read_json(file: str) -> Any:
    try:
        data = click.get_binary_stream("stdin").read() if file == "-" else Path(file).read_bytes()
    except OSError as error:
        raise UnreadableFile(f"cannot read: {error.strerror or error}") from None
    try:
        return json.loads(data.decode("utf-8-sig"), parse_constant=reject_constant)
    except UnicodeDecodeError:
        raise UnreadableFile("not valid JSON: not UTF-8 text") from None
    except RecursionError:
        raise UnreadableFile("not valid JSON: nested too deeply") from None
    except ValueError as error:
        raise UnreadableFile(f"not valid JSON: {error}") from None


def reject_constant(name: str) -> Any:
    # NaN and Infinity are not JSON: CouchDB would refuse them.
    raise ValueError(f"{name} is not a JSON value")


def _register_extensions() -> None:
    """Commands that live in their own modules (analytics, benchmarks)."""
    import importlib

    for module, name in (("jobdist.analytics", "report"), ("jobdist.bench", "bench")):
        try:
            main.add_command(getattr(importlib.import_module(module), name))
        except ModuleNotFoundError as error:
            if error.name != module:
                raise


_register_extensions()


if __name__ == "__main__":
    main(prog_name="jobdist")
