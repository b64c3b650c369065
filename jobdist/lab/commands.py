"""`jobdist cluster` and `jobdist demo`: the lab's commands, loaded only when run."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..cli.common import sites_option
from ..config import SiteConfig
from .cluster import DEFAULT_STATE_DIR, LocalCluster
from .demo import run_demo

state_option = click.option("--state", "state_dir", default=str(DEFAULT_STATE_DIR),
                            show_default=True, type=click.Path(path_type=Path),
                            help="Where the local cluster keeps pids and logs.")


@click.group()
def cluster() -> None:
    """A local cluster: a server and a daemon for every site of a sites directory."""


@cluster.command("up")
@sites_option
@state_option
@click.option("--in-memory", is_flag=True, help="Servers keep nothing on disk.")
def cluster_up(sites_dir: Path, state_dir: Path, in_memory: bool) -> None:
    """Start every site and continuous replication; return once all are ready. With
    a cluster up, start whatever of it is stopped (a site's server, a daemon)."""
    local = LocalCluster(sites_dir, state_dir, in_memory=in_memory)
    started = local.up()
    if not started:
        click.echo(f"every site is up already (state in {state_dir})")
    elif len(started) < 2 * len(local.sites):  # part of the cluster ran: say what is new
        click.echo(f"started {', '.join(started)}")
    for row in local.status():
        click.echo(f"{row['site']:<10} {row['url']:<26} fauxton {row['fauxton']}"
                   + (f"  dashboard {row['dashboard']}" if row["dashboard"] else ""))
    click.echo(admin_token_line(local.sites))


def admin_token_line(sites: dict[str, SiteConfig]) -> str:
    """Where the dashboards' admin token is, or that their actions are off."""
    files = sorted({str(site.admin.token_file) for site in sites.values()
                    if site.admin.token_file is not None})
    if files:
        return (f"admin token in {', '.join(files)} (mode 600): give it to a dashboard's "
                "token field, or send `Authorization: Bearer TOKEN` with a POST")
    if all(site.admin.token for site in sites.values()):
        return "admin token from the site configs or $JOBDIST_ADMIN_TOKEN"
    return ("no admin token configured ([admin] token_file): the dashboards offer no "
            "actions and every POST is refused")


@cluster.command("down")
@sites_option
@state_option
def cluster_down(sites_dir: Path, state_dir: Path) -> None:
    """Stop exactly the processes `cluster up` started."""
    stopped = LocalCluster(sites_dir, state_dir).down()
    for line in stopped:
        click.echo(f"stopped {line}")
    if not stopped:
        click.echo(f"nothing to stop: no process recorded in {state_dir} is running")


@cluster.command("status")
@sites_option
@state_option
def cluster_status(sites_dir: Path, state_dir: Path) -> None:
    """Show each site's server and daemon, its Fauxton and its dashboard."""
    for row in LocalCluster(sites_dir, state_dir).status():
        click.echo(f"{row['site']:<10} server {row['server']:<22} daemon {row['daemon']:<22} "
                   f"fauxton {row['fauxton']}"
                   + (f"  dashboard {row['dashboard']}" if row["dashboard"] else ""))


@click.command()
@click.option("--step-seconds", default=0.5, show_default=True,
              help="How long each step sleeps (the thesis used 5).")
@click.option("--only", multiple=True, help="Run only scenarios whose name starts so.")
def demo(step_seconds: float, only: tuple[str, ...]) -> None:
    """Run the thesis's four evaluation scenarios on local clusters; print a table."""
    sys.exit(run_demo(step_seconds, only))
