"""What every command shares: the site options, picking and connecting to a site,
`CliError` and the exit codes (RQ's `cli/helpers.py` plays the same part)."""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:  # imported where used: `jobdist --help` loads no CouchDB client
    from jobdist.config import SiteConfig
    from jobdist.couch import Database

# Every command: 2 for an error people meet (see Cli; `validate`: a job that breaks a
# rule or cannot be read, as `submit` refuses it); 1 when the outcome is
# "no" (a waited-for job failed or was cancelled, a cancel came too late).
EXIT_ERROR = 2
EXIT_JOB_NOT_OK = 1
EXIT_INTERRUPTED = 130

SITE_META = "jobdist.site"  # click context meta: the site a command talks to


class CliError(Exception):
    """An error for the user: one or more lines (each printed as one line), an exit code."""

    def __init__(self, *lines: str, code: int = EXIT_ERROR) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines
        self.code = code


sites_option = click.option(
    "--sites", "sites_dir", default="sites", show_default=True, envvar="JOBDIST_SITES",
    type=click.Path(path_type=Path), help="Directory of site configs ($JOBDIST_SITES).")
SITE_HELP = ("The site whose CouchDB to talk to ($JOBDIST_SITE; default: global, or the only "
             "site).")
site_option = click.option(
    "--site", "--at", "site_name", default=None, envvar="JOBDIST_SITE", metavar="SITE",
    help=SITE_HELP)
# `submit` says --site only: its --at is the time the job may start at.
submit_site_option = click.option(
    "--site", "site_name", default=None, envvar="JOBDIST_SITE", metavar="SITE", help=SITE_HELP)


def load_site_configs(sites_dir: Path) -> dict[str, SiteConfig]:
    from jobdist.config import ConfigError, load_sites

    try:
        return load_sites(sites_dir)
    except ConfigError as error:
        if not Path(sites_dir).is_dir():
            raise CliError(f"{error} (give --sites DIR or set $JOBDIST_SITES)") from None
        raise


def pick_site(sites: dict[str, SiteConfig], name: str | None) -> SiteConfig:
    if name is None:
        if "global" in sites:
            name = "global"
        elif len(sites) == 1:
            name = next(iter(sites))
        else:
            raise CliError(f"which site? give --site, one of: {', '.join(sorted(sites))}")
    return known_site(sites, name)


def known_site(sites: dict[str, SiteConfig], name: str, option: str = "") -> SiteConfig:
    """The site called `name`; a CliError naming the known ones (and the option) if none is."""
    if name not in sites:
        prefix = f"{option}: " if option else ""
        raise CliError(f"{prefix}unknown site {name!r}; known: {', '.join(sorted(sites))}")
    return sites[name]


def open_site(sites_dir: Path, name: str | None) -> tuple[SiteConfig, Database]:
    return connect(pick_site(load_site_configs(sites_dir), name))


def connect(site: SiteConfig) -> tuple[SiteConfig, Database]:
    """The site's jobs database, for the command under way (its errors name the site)."""
    from jobdist.client import site_database

    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[SITE_META] = site
    return site, site_database(site)


def operator_name() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment
        return "an operator"
