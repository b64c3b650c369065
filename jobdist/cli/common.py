"""What every command shares: the site options, picking and connecting to a site,
`CliError` and the exit codes (RQ's `cli/helpers.py` plays the same part)."""

from __future__ import annotations

import functools
import getpass
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

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
F = TypeVar("F", bound=Callable[..., Any])


class CliError(Exception):
    """An error for the user: one or more lines (each printed as one line), an exit code."""

    def __init__(self, *lines: str, code: int = EXIT_ERROR) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines
        self.code = code


class FiniteFloat(click.FloatRange):
    """A FloatRange that also refuses nan (no comparison rules it out) and inf."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{number} is not a finite number", param, ctx)
        return number


sites_option = click.option(
    "--sites", "sites_dir", default="sites", show_default=True, envvar="JOBDIST_SITES",
    type=click.Path(path_type=Path), help="Directory of site configs ($JOBDIST_SITES).")


def site_option_as(*names: str, help: str = "The site whose CouchDB to talk to "
                   "($JOBDIST_SITE; default: global, or the only site).") -> Callable[[F], F]:
    """The option naming the site to talk to: --site or --at, or one of them where the
    other means something else."""
    return click.option(*names, "site_name", default=None, envvar="JOBDIST_SITE",
                        metavar="SITE", help=help)


site_option = site_option_as("--site", "--at")

# A job's options shared by `submit`, `validate` and `schedule add`.
format_option = click.option(
    "--format", "file_format", type=click.Choice(["auto", "json", "yaml"]), default="auto",
    show_default=True, help="How FILE is written; auto: by its extension (.json, .yaml, .yml), "
                            "else JSON when it starts with { or [, else YAML.")
step_option = click.option("--step", "steps", multiple=True, metavar="CMD",
                           help="A step's shell command; repeat for more steps, run in order.")
target_option = click.option(
    "--target", "targets", multiple=True, metavar="SITES",
    help="Where the step at the same position may run: a site, a comma-separated list of "
         "sites, or any. Give none (all any) or one per --step.")


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


def at_site(command: Callable[..., None]) -> Callable[..., None]:
    """The --sites and --site options, handed to `command` as the site and its database."""

    @sites_option
    @site_option
    @functools.wraps(command)
    def opened(*args: Any, sites_dir: Path, site_name: str | None, **kwargs: Any) -> None:
        site, db = connect(pick_site(load_site_configs(sites_dir), site_name))
        command(*args, site=site, db=db, **kwargs)

    return opened


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
