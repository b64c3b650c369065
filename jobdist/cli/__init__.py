"""The `jobdist` command line: a thin shell over `jobdist.client`.

Every command talks to one site's CouchDB (`--site`) named in a sites directory
(`--sites`), except `setup` and `watch`, which visit every site.

A command's module is imported only when that command runs: `jobdist --help`
loads none of them, nor CouchDB's client, rich or Spark. Errors people meet are
one line on stderr starting with `jobdist:` and exit status 2, never a
traceback: see `Cli`.
"""

from __future__ import annotations

import importlib
import io
import sys
import textwrap
from typing import Any

import click

import jobdist
from jobdist.errors import JobdistError

from .common import EXIT_ERROR, EXIT_INTERRUPTED, SITE_META, CliError

# Every command: where it lives, imported only when it runs, and its line in
# `jobdist --help` (tests/test_cli_errors.py checks each against the command's own).
COMMANDS = {
    "adopt": ("jobdist.cli.jobs:adopt",
              "Make this site (--site) the creator of every live job that SITE created."),
    "bench": ("jobdist.lab.bench:bench",
              "Benchmarks against the thesis's figures and the local server's own limits."),
    "cancel": ("jobdist.cli.jobs:cancel", "Cancel a job."),
    "cleanup": ("jobdist.cli.sites:cleanup",
                "Remove finished jobs (success, failed, cancelled) past a retention period."),
    "cluster": ("jobdist.lab.commands:cluster",
                "A local cluster: a server and a daemon for every site of a sites directory."),
    "demo": ("jobdist.lab.commands:demo",
             "Run the thesis's four evaluation scenarios on local clusters; print a table."),
    "drop-site": ("jobdist.cli.jobs:drop_site",
                  "Remove SITE, lost for good, from JOB_ID's current broadcast step."),
    "list": ("jobdist.cli.jobs:list_command",
             "List jobs, newest first, from the site's views (a page at a time)."),
    "logs": ("jobdist.cli.jobs:logs",
             "Print each step's output: the last 4 KiB of stdout and stderr (a broadcast "
             "step's at each site), with its exit code and time."),
    "report": ("jobdist.analytics:report",
               "Analyse every job in a site's database with Spark: tables and an HTML report."),
    "schedule": ("jobdist.cli.schedules:schedule",
                 "Jobs made on a schedule: at every tick of a cron expression, by one owner "
                 "site."),
    "secrets": ("jobdist.cli.sites:secrets",
                "Write the credentials and admin token files the site configs name and nobody "
                "has written yet (random secrets, mode 600); existing ones are kept."),
    "setup": ("jobdist.cli.sites:setup",
              "Create each site's database, upload its design documents, and write the "
              "replications the topology needs; remove stale `jobdist-*` replications."),
    "show": ("jobdist.cli.jobs:show",
             "Show a job as a site sees it: its steps and history, merged from all its "
             "conflicting revisions (as the daemons merge them)."),
    "site": ("jobdist.cli.sites:site", "Run a site daemon."),
    "submit": ("jobdist.cli.jobs:submit", "Submit a job at a site and print its id."),
    "validate": ("jobdist.cli.jobs:validate",
                 "Check the job in FILE (JSON or YAML, `-` for stdin) as `submit` would: the "
                 "document's rules, and its targets against the sites directory."),
    "watch": ("jobdist.cli.jobs:watch",
              "A live view of every site: jobs by status, busy workers and running steps."),
}


class Cli(click.Group):
    """Commands loaded when run; errors people meet are one clear line and exit 2,
    never a traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, _, attribute = COMMANDS[name][0].partition(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands' list from COMMANDS, without importing them."""
        limit = formatter.width - 6 - max(map(len, COMMANDS))
        rows = [(name, textwrap.shorten(text, limit, placeholder="..."))
                for name, (_, text) in sorted(COMMANDS.items())]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # not Click's `Aborted!` and exit 1, a failed job's code
            click.echo("jobdist: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except click.UsageError as error:  # an option or argument Click refused
            command = f" (see `{error.ctx.command_path} --help`)" if error.ctx else ""
            click.echo(f"jobdist: {error.format_message().rstrip('.')}{command}", err=True)
            sys.exit(error.exit_code)
        except CliError as error:
            for line in error.lines:
                click.echo(f"jobdist: {line}", err=True)
            sys.exit(error.code)
        except JobdistError as error:
            click.echo(f"jobdist: {error}", err=True)
            sys.exit(EXIT_ERROR)
        except Exception as error:
            couch = sys.modules.get("jobdist.couch")  # loaded if it raised
            if couch is None or not isinstance(error, couch.CouchError):
                raise
            from jobdist.render import explain_couch_error

            click.echo(f"jobdist: {explain_couch_error(error, ctx.meta.get(SITE_META))}",
                       err=True)
            sys.exit(EXIT_ERROR)


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(jobdist.__version__, prog_name="jobdist", message="%(prog)s %(version)s")
def main() -> None:
    """A multi-site job distributor on replicated CouchDB.

    Commands talk to one site's CouchDB, named in the sites directory (--sites,
    $JOBDIST_SITES) by --site ($JOBDIST_SITE, default global).
    """
    # What a document holds is printed even when it is not text (a lone surrogate
    # written over HTTP): escaped as \ud800, which keeps `--json` output valid JSON.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="backslashreplace")

