"""Commands about jobs: submit, show, logs, list, cancel, adopt, drop-site, watch, validate."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import sys
import time
from itertools import islice
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.live import Live

from jobdist import client
from jobdist.client import STATUSES
from jobdist.config import SiteConfig
from jobdist.couch import Database
from jobdist.jobfile import (
    UnreadableFile,
    job_submission,
    read_job_file,
    unknown_targets,
    wait_options,
)
from jobdist.model import Doc
from jobdist.render import (
    LIST_COLUMNS,
    event_line,
    failure_reason,
    history_table,
    job_header,
    list_row,
    make_console,
    progress_events,
    progress_view,
    step_log,
    step_where,
    steps_table,
    unknown_awaited_note,
    watch_view,
)
from jobdist.tables import FittedTable
from jobdist.validation import SITE_NAME_REASON, is_site_name, validate_submission

from .common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_JOB_NOT_OK,
    CliError,
    FiniteFloat,
    at_site,
    connect,
    format_option,
    known_site,
    load_site_configs,
    operator_name,
    pick_site,
    site_option_as,
    sites_option,
    step_option,
    target_option,
)

# --- submit ------------------------------------------------------------------------


@click.command()
@click.argument("file", required=False)
@format_option
@step_option
@target_option
@click.option("--retries", "retries", multiple=True, type=click.IntRange(min=0), metavar="N",
              help="Retries after a failed attempt: once for every step, or one per --step.")
@click.option("--timeout", "timeouts", multiple=True, type=FiniteFloat(min=0, min_open=True),
              metavar="S", help="Seconds an attempt may run: once for every step, or one per "
                                "--step.")
@click.option("--alt", "alts", multiple=True, metavar="CMD",
              help="Command run when the step's command failed after its retries: once for "
                   "every step, or one per --step.")
@click.option("--priority", type=int, default=None,
              help="Higher runs first (default 0; overrides the file's).")
@click.option("--after", "after", multiple=True, metavar="ID",
              help="Start only once the job ID has succeeded (repeat for more jobs); its "
                   "creator fails this job if one fails or is cancelled.")
@click.option("--after-policy", type=click.Choice(["success", "always"]), default=None,
              help="always: start once the --after jobs have ended, however they ended "
                   "(default success).")
@click.option("--at", "at", metavar="TIME",
              help="Start no sooner than TIME, ISO 8601 with its zone, e.g. 2026-11-23T02:00Z "
                   "(by the creator's clock).")
@click.option("--in", "delay", metavar="DURATION",
              help="Start no sooner than DURATION from now, e.g. 10m, 2h, 1d.")
@click.option("--wait", is_flag=True,
              help="Follow the job until it ends; exit 0 on success, 1 if it failed or was "
                   "cancelled.")
@click.option("--dry-run", is_flag=True, help="Print the job as it would be submitted; "
                                              "submit nothing.")
@sites_option
@site_option_as("--site")  # its --at is the time the job may start at
def submit(file: str | None, file_format: str, steps: tuple[str, ...],
           targets: tuple[str, ...], retries: tuple[int, ...], timeouts: tuple[float, ...],
           alts: tuple[str, ...], priority: int | None, after: tuple[str, ...],
           after_policy: str | None, at: str | None, delay: str | None, wait: bool,
           dry_run: bool, sites_dir: Path, site_name: str | None) -> None:
    """Submit a job at a site and print its id.

    The job comes from FILE (JSON or YAML, `-` for stdin), or from --step
    options, e.g.

      jobdist submit --step 'make' --target reg_a --step 'make test' --target any --retries 2

    --after, --after-policy, --at and --in set the job's wait (over a FILE's own).

    Targets are checked against the sites directory; every validation error
    is printed on a line of its own (exit 2).
    """
    submission = job_submission(file, file_format, steps, targets, retries, timeouts, alts,
                                priority)
    waits = wait_options(after, after_policy, at, delay)
    if waits and isinstance(submission, dict):
        submission.update(waits)
    sites = load_site_configs(sites_dir)
    errors = job_errors(submission, sites)
    if errors:
        raise CliError(*errors)
    site, db = connect(pick_site(sites, site_name))
    try:
        if dry_run:
            click.echo(json.dumps(client.prepare(submission, site.name), indent=2))
            return
        job = client.submit(db, site.name, submission)
    except client.InvalidJob as invalid:
        raise CliError(*invalid.problems) from None
    click.echo(job["_id"])
    warn_of_unknown_awaited(db, site.name, job)
    if wait:
        final = follow_job(db, site, job["_id"])
        sys.exit(0 if final["job_status"] == "success" else EXIT_JOB_NOT_OK)


def warn_of_unknown_awaited(db: Database, site: str, job: Doc) -> None:
    """Accepted all the same: the job waited for may be submitted later, or elsewhere."""
    awaited = client.awaited_statuses(db, job)
    missing = [job_id for job_id, status in awaited.items() if status is None]
    if missing:
        click.echo(f"jobdist: warning: {unknown_awaited_note(missing, site)}", err=True)


def follow_job(db: Database, site: SiteConfig, job_id: str, interval: float = 0.5) -> Doc:
    """Show the job's progress until it ends (a live table on a terminal, event lines
    otherwise); return its final merged document."""
    console = make_console()
    seen: set[str] = set()
    try:
        with Live(console=console) if console.is_terminal else contextlib.nullcontext() as live:
            while True:
                doc, _ = client.read_merged(db, site.name, job_id)
                if live is not None:
                    live.update(progress_view(doc))
                else:
                    echo_new_events(doc, seen)
                if doc["job_status"] is not None:
                    break
                time.sleep(interval)
    except KeyboardInterrupt:
        click.echo(f"stopped following {job_id}; the job goes on: jobdist show {job_id}",
                   err=True)
        sys.exit(EXIT_INTERRUPTED)
    click.echo(f"{job_id}: {doc['job_status']}{failure_reason(doc)}")
    return doc


def echo_new_events(doc: Doc, seen: set[str]) -> None:
    """A line for each history entry and progress report of the job not in `seen` yet."""
    history = [(json.dumps(entry, sort_keys=True), event_line(entry))
               for entry in doc.get("history", [])]
    for key, line in [*history, *((line, line) for line in progress_events(doc))]:
        if key not in seen:
            seen.add(key)
            click.echo(line)


# --- show, logs ---------------------------------------------------------------------------


@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True,
              help="Print the merged document (with `_conflicts` when there are).")
@at_site
def show(job_id: str, as_json: bool, site: SiteConfig, db: Database) -> None:
    """Show a job as a site sees it: its steps and history, merged from all its
    conflicting revisions (as the daemons merge them)."""
    doc, leaves = client.read_merged(db, site.name, job_id)
    if as_json:
        shown = client.with_conflicts(doc, leaves)
        click.echo(json.dumps(shown, indent=2, ensure_ascii=False))
        return
    header = job_header(doc, len(leaves), site.name, client.awaited_statuses(db, doc))
    make_console().print(header, "", steps_table(doc), "", history_table(doc), sep="\n")


@click.command()
@click.argument("job_id")
@click.option("--step", "only_step", type=int, default=None, help="Only this step (from 0).")
@at_site
def logs(job_id: str, only_step: int | None, site: SiteConfig, db: Database) -> None:
    """Print each step's output: the last 4 KiB of stdout and stderr (a broadcast
    step's at each site), with its exit code and time."""
    doc, _ = client.read_merged(db, site.name, job_id)
    indexes = range(len(doc["job"]))
    if only_step is not None and only_step not in indexes:
        raise CliError(f"job {job_id} has steps 0 to {len(doc['job']) - 1}, not {only_step}")
    for index in indexes if only_step is None else [only_step]:
        click.echo(step_log(doc, index), nl=False)


MAX_LIMIT = 10**9  # more than any site holds; islice takes no more than sys.maxsize
TIME_PREFIX = re.compile(r"^\d{4}(-\d{2}(-\d{2}([T ][0-9:.]*Z?)?)?)?$")


@click.command("list")
@click.option("--status", type=click.Choice(STATUSES), help="Only jobs in this state.")
@click.option("--site", "involving", metavar="SITE",
              help="Only jobs that concern SITE: a step targets it by name (alone or in a "
                   "list; `any` names no site), was won by it or was started there.")
@click.option("--creator", metavar="SITE", help="Only jobs created at SITE.")
@click.option("--limit", type=click.IntRange(min=1, max=MAX_LIMIT), default=50, show_default=True,
              help="Show at most this many jobs.")
@click.option("--before", metavar="TIME",
              help="Only jobs created before TIME (ISO 8601 UTC, or a prefix such as "
                   "2026-11-22): the next page after a listing's last job.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per job, one a line.")
@sites_option
@site_option_as("--at", help="The site whose CouchDB to ask ($JOBDIST_SITE; default: global, "
                             "or the only site). Elsewhere --site, here --at: --site filters.")
def list_command(status: str | None, involving: str | None, creator: str | None, limit: int,
                 before: str | None, as_json: bool, sites_dir: Path,
                 site_name: str | None) -> None:
    """List jobs, newest first, from the site's views (a page at a time)."""
    if before is not None:
        before = before.strip().replace(" ", "T")
        if not TIME_PREFIX.match(before):
            raise CliError(f"--before {before!r}: give an ISO 8601 time such as "
                           "2026-11-22T00:35:12Z or a prefix of one")
    sites = load_site_configs(sites_dir)
    # A misspelt site would list nothing, as if it had no jobs.
    for option, name in (("--site", involving), ("--creator", creator)):
        if name is not None:
            known_site(sites, name, option)
    site, db = connect(pick_site(sites, site_name))
    rows = client.list_jobs(db, status=status, creator=creator, site=involving, before=before,
                     page_size=min(limit + 1, 100))
    shown = list(islice(rows, limit + 1))
    more, shown = len(shown) > limit, shown[:limit]
    if as_json:
        for row in shown:
            click.echo(json.dumps(dataclasses.asdict(row)))
        return
    if not shown:
        click.echo(f"no jobs match at site {site.name}")
        return
    console = make_console()
    console.print(FittedTable(LIST_COLUMNS, [list_row(row) for row in shown]))
    if more:
        filters = (("--status", status), ("--site", involving), ("--creator", creator))
        again = " ".join(["jobdist list", *(f"{flag} {value}" for flag, value in filters if value),
                          f"--before {shown[-1].created_at}"])
        click.echo(f"{len(shown)} newest shown; older: {again}")


# --- cancel ------------------------------------------------------------------------------


@click.command()
@click.argument("job_id")
@click.option("--reason", default=None, help="Why (kept in the job's history).")
@at_site
def cancel(job_id: str, reason: str | None, site: SiteConfig, db: Database) -> None:
    """Cancel a job. The site running its current step sees the change on its
    feed and kills the step's process group. Exit 1 if the job had already
    ended otherwise."""
    reason = reason or f"cancelled by {operator_name()} from the command line"
    outcome = client.cancel(db, site.name, job_id, reason)
    status = outcome.job["job_status"]
    if status == "cancelled":
        click.echo(f"{job_id} was cancelled already")
    elif status is not None:
        click.echo(f"{job_id} already ended: {status}; nothing to cancel")
        sys.exit(EXIT_JOB_NOT_OK)
    else:
        step = outcome.running_step
        where = (f"; step {outcome.job['step']} ({step['do']}) is running at "
                 f"{step_where(step)}, which stops it when the change reaches it"
                 if step is not None else "")
        click.echo(f"cancelled {job_id} at site {site.name}{where}")


@click.command()
@click.option("--from", "gone", required=True, metavar="SITE",
              help="The creator site that is gone for good.")
@click.option("--reason", default=None, help="Why (kept in each job's history).")
@click.option("--dry-run", is_flag=True, help="Count the jobs; change nothing.")
@at_site
def adopt(gone: str, reason: str | None, dry_run: bool, site: SiteConfig,
          db: Database) -> None:
    """Make this site (--site) the creator of every live job that SITE created.

    For a creator site lost for good: without its creator a job's claims wait
    forever. Use it only once SITE is down for good or cut off: if SITE still
    runs behind a partition, both arbitrate until it sees the adoption, and a
    step may then run twice (in two epochs, recorded in the history)."""
    if not is_site_name(gone):  # no job could name it: adopting it would do nothing
        raise CliError(f"--from {gone!r}: {SITE_NAME_REASON}")
    if gone == site.name:
        raise CliError(f"site {site.name} cannot adopt its own jobs: run this at another site "
                       "(--site)")
    reason = reason or f"adopted by {operator_name()} from the command line"
    if dry_run:
        count = len(client.live_jobs_created_by(db, gone))
        click.echo(f"{count} live jobs created by {gone} would be adopted by {site.name}")
        return
    adopted = client.adopt(db, site.name, gone, reason)
    click.echo(f"{site.name} adopted {adopted} live jobs created by {gone}")


@click.command("drop-site")
@click.argument("job_id")
@click.argument("lost_site", metavar="SITE")
@click.option("--reason", default=None, help="Why (kept in the job's history).")
@at_site
def drop_site(job_id: str, lost_site: str, reason: str | None, site: SiteConfig,
              db: Database) -> None:
    """Remove SITE, lost for good, from JOB_ID's current broadcast step.

    Run it at the job's creator (--site). The step then waits for the other sites
    only; if SITE comes back, its part of the step is stopped and does not count."""
    reason = reason or f"dropped by {operator_name()} from the command line"
    job = client.drop_site(db, site.name, job_id, lost_site, reason)
    click.echo(f"dropped {lost_site} from step {job['step']} of {job_id} at site {site.name}; "
               "the step now waits for the other sites only")


@click.command()
@click.option("--once", is_flag=True, help="Print one snapshot and exit.")
@click.option("--interval", type=FiniteFloat(min=0.1), default=2.0, show_default=True,
              help="Seconds between refreshes.")
@sites_option
def watch(once: bool, interval: float, sites_dir: Path) -> None:
    """A live view of every site: jobs by status, busy workers and running steps.

    With --once, the exit status is 1 when a site's CouchDB did not answer."""
    sites = load_site_configs(sites_dir).values()
    console = make_console()
    if once:
        snapshots = [client.snapshot_site(site) for site in sites]
        console.print(watch_view(snapshots))
        sys.exit(1 if any(snap.error for snap in snapshots) else 0)
    with contextlib.suppress(KeyboardInterrupt), Live(console=console) as live:
        while True:
            live.update(watch_view([client.snapshot_site(site) for site in sites]))
            time.sleep(interval)


# --- validate ----------------------------------------------------------------------------


@click.command()
@click.argument("file")
@format_option
@sites_option
def validate(file: str, file_format: str, sites_dir: Path) -> None:
    """Check the job in FILE (JSON or YAML, `-` for stdin) as `submit` would: the
    document's rules, and its targets against the sites directory. Exit 2 if it
    breaks any."""
    name = "<stdin>" if file == "-" else file
    try:
        doc = read_job_file(file, file_format)
    except UnreadableFile as problem:
        click.echo(str(problem), err=True)
        sys.exit(EXIT_ERROR)
    errors = job_errors(doc, validation_sites(doc, name, sites_dir))
    for error in errors:
        click.echo(f"{name}: {error}")
    if errors:
        sys.exit(EXIT_ERROR)
    click.echo(f"{name}: ok")


def validation_sites(doc: Any, name: str, sites_dir: Path) -> dict[str, SiteConfig] | None:
    """The sites to check targets against; None, said on stderr when the job names a
    site, when the default sites directory is absent (a directory given must exist)."""
    source = click.get_current_context().get_parameter_source("sites_dir")
    if source == ParameterSource.DEFAULT and not sites_dir.is_dir():
        if unknown_targets(doc, ()):
            click.echo(f"{name}: targets not checked: no sites directory {sites_dir}/ here "
                       "(give --sites DIR or set $JOBDIST_SITES)", err=True)
        return None
    return load_site_configs(sites_dir)


def job_errors(submission: Any, sites: dict[str, SiteConfig] | None) -> list[str]:
    """Every reason `submit` refuses the job: the document's rules, then targets no site
    of the sites directory is called (unchecked without one)."""
    errors = validate_submission(submission)
    return errors + (unknown_targets(submission, sites) if sites is not None else [])
