"""The `jobdist` command line: a thin shell over `jobdist.client`.

Every command talks to one site's CouchDB (`--site`, default `$JOBDIST_SITE`,
else `global`) named in a sites directory (`--sites`, default
`$JOBDIST_SITES`, else `sites`), except `setup` and `watch`, which visit every
site. What a command shows of a job is the merge of all its live leaf
revisions (`core.merge`), the same view the daemons decide on, never CouchDB's
winning revision alone.

The commands live by subject: `jobs.py` (submit, show, logs, list, cancel,
adopt, watch, validate), `sites.py` (site run, setup, secrets, cleanup); the
lab's (`cluster`, `demo`, `bench`) and the Spark `report` are loaded only when
run. Errors people meet (an unknown site, an unreachable CouchDB, a bad job
file, a missing sites directory or config) are one line on stderr starting
with `jobdist:` and exit status 2, never a traceback: see `Cli`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from typing import Any

import click

import jobdist
from jobdist.couch import CouchError
from jobdist.errors import JobdistError
from jobdist.render import explain_couch_error

from . import jobs, sites
from .common import EXIT_ERROR, SITE_META, CliError

# Commands that live in other modules, imported only when run: `jobdist site run`
# (the daemon) must not load the lab, nor `jobdist status` the Spark report.
LAZY_COMMANDS = {
    "cluster": "jobdist.lab.commands:cluster",
    "demo": "jobdist.lab.commands:demo",
    "bench": "jobdist.lab.bench:bench",
    "report": "jobdist.analytics:report",
}


class Cli(click.Group):
    """Errors people meet are one clear line and exit 2, never a traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in LAZY_COMMANDS:
            return super().get_command(ctx, name)
        module, _, attribute = LAZY_COMMANDS[name].partition(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CliError as error:
            for line in error.lines:
                click.echo(f"jobdist: {line}", err=True)
            sys.exit(error.code)
        except CouchError as error:
            click.echo(f"jobdist: {explain_couch_error(error, ctx.meta.get(SITE_META))}",
                       err=True)
            sys.exit(EXIT_ERROR)
        except JobdistError as error:
            click.echo(f"jobdist: {error}", err=True)
            sys.exit(EXIT_ERROR)


def jobdist_version() -> str:
    """The installed distribution's version, else (run from a checkout) the package's."""
    try:
        return importlib.metadata.version("jobdist")
    except importlib.metadata.PackageNotFoundError:
        return jobdist.__version__


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(jobdist_version(), "--version", prog_name="jobdist",
                      message="%(prog)s %(version)s")
def main() -> None:
    """A multi-site job distributor on replicated CouchDB.

    Commands talk to one site's CouchDB, named in the sites directory (--sites,
    $JOBDIST_SITES) by --site ($JOBDIST_SITE, default global).
    """


for command in (*jobs.COMMANDS, *sites.COMMANDS):
    main.add_command(command)

