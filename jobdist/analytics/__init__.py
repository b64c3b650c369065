"""`jobdist report`: job analytics on Spark, from a site's CouchDB to tables and one
HTML page (docs/analytics.md). `source` reads the documents into rows, `tables`
derives the tables and the summary, `page` draws the report and runs the pipeline.

This module is the command. It imports them, and so pyspark and matplotlib (the
`analytics` extra), only when it runs: without them it fails in one line."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jobdist.cli.common import (
    CliError,
    connect,
    load_site_configs,
    pick_site,
    site_option,
    sites_option,
)

# The modules of the `analytics` extra, and the package that brings each.
EXTRA = {"pyspark": "pyspark", "py4j": "pyspark", "matplotlib": "matplotlib"}


class StageDisplay:
    """A spinner on the current stage, and a line with the time of each finished one."""

    def __init__(self, status: Any, console: Console) -> None:
        self.status, self.console = status, console
        self.current: str | None = None
        self.since = time.monotonic()

    def __call__(self, name: str) -> None:
        self.done()
        self.current, self.since = escape(name), time.monotonic()  # "local[2]" is no markup
        self.status.update(f"{self.current} …")

    def done(self) -> None:
        if self.current is not None:
            elapsed = time.monotonic() - self.since
            self.console.print(f"[green]✓[/] {self.current} ({elapsed:.1f} s)")
        self.current = None


@click.command("report")
@sites_option
@site_option
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the tables (Parquet and CSV) and report.html.")
@click.option("--master", default="local[*]", show_default=True, help="Spark master.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1),
              help="Workers per site, for utilisation (documents do not record it).")
def report(sites_dir: Path, site_name: str | None, out: Path, master: str,
           workers: int) -> None:
    """Analyse every job in a site's database with Spark: tables and an HTML report.

    The site's CouchDB, database and login come from its config in the sites
    directory, as for every command."""
    site = pick_site(load_site_configs(sites_dir), site_name)
    connect(site)  # a CouchDB error now names the site
    console = Console()  # stdout: stderr is the JVM's log while Spark starts
    try:
        from jobdist.analytics.page import headline, run_report, skipped_line
        from jobdist.analytics.source import CouchSource

        with console.status("starting …") as status:
            display = StageDisplay(status, console)
            summary = run_report(CouchSource.of_site(site), out, master, workers,
                                 on_stage=display)
            display.done()
    except ModuleNotFoundError as error:
        if error.name not in EXTRA:
            raise
        raise CliError(f"{EXTRA[error.name]} is not installed: pip install 'jobdist[analytics]'") \
            from None
    except OSError as error:
        raise CliError(" ".join(str(error).split())) from None
    table = Table(show_header=False, box=None)
    for label, value in headline(summary):
        table.add_row(label, value)
    console.print(table)
    console.print(f"report: {summary['report']} ({summary['seconds']:.1f} s)")
    if (line := skipped_line(summary["skipped"])) is not None:
        click.echo(f"jobdist: {line}", err=True)
