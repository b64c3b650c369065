"""The `jobdist` command line.

Every command talks to one site's CouchDB (`--site`, default `$JOBDIST_SITE`,
else `global`) named in a sites directory (`--sites`, default
`$JOBDIST_SITES`, else `sites`), except `setup` and `watch`, which visit every
site. What a command shows of a job is the merge of all its live leaf
revisions (`core.merge`), the same view the daemons decide on, never CouchDB's
winning revision alone.

Errors people meet (an unknown site, an unreachable CouchDB, a bad job file,
a missing sites directory or config) are one line on stderr starting with
`jobdist:` and exit status 2, never a traceback: see `Cli`.
"""

from __future__ import annotations

import contextlib
import getpass
import heapq
import importlib
import importlib.metadata
import json
import math
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

import jobdist
from jobdist import core
from jobdist.config import ConfigError, SiteConfig, ensure_credentials, load_site, load_sites
from jobdist.couch import (
    Conflict,
    Couch,
    CouchError,
    Database,
    NotFound,
    Saved,
    Unavailable,
)
from jobdist.errors import JobdistError
from jobdist.model import (
    FINAL_STATUSES,
    Doc,
    Phase,
    job_from_submission,
    normalise,
    step_phase,
    targets,
    utc_now,
)
from jobdist.retention import cleanup as run_cleanup
from jobdist.retention import parse_duration
from jobdist.tables import Cell, Col, FittedTable
from jobdist.validation import validate_job, validate_submission

# Exit codes of `validate`: 1 when the job breaks rules, 2 when it cannot be read.
EXIT_INVALID = 1
EXIT_UNREADABLE = 2
# Every command: 2 for an error people meet (see Cli); 1 when the outcome is
# "no" (a waited-for job failed or was cancelled, a cancel came too late).
EXIT_ERROR = 2
EXIT_JOB_NOT_OK = 1
EXIT_INTERRUPTED = 130

DDOC = "jobdist"
STATUSES = ("live", *FINAL_STATUSES)
SITE_META = "jobdist.site"  # click context meta: the site a command talks to


class CliError(Exception):
    """An error for the user: one or more lines (each printed as one line), an exit code."""

    def __init__(self, *lines: str, code: int = EXIT_ERROR) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines
        self.code = code


class UnreadableFile(Exception):
    """The file is missing, unreadable or not JSON/YAML; the message says which."""


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
        except (JobdistError, UnreadableFile) as error:
            click.echo(f"jobdist: {error}", err=True)
            sys.exit(EXIT_ERROR)


def explain_couch_error(error: CouchError, site: SiteConfig | None) -> str:
    """One line: what failed, at which site, and what to do about it when we know."""
    text = str(error)
    if isinstance(error, Unavailable) and error.status is None:  # no answer at all
        lowered = text.lower()
        if "connection refused" in lowered or "errno 111" in lowered:
            cause = "connection refused"
        elif "timed out" in lowered or "timeout" in lowered:
            cause = "timed out"
        elif any(s in lowered for s in ("name or service not known", "failed to resolve",
                                        "nodename nor servname", "name resolution")):
            cause = "unknown host"
        else:
            cause = "no answer"
        where = (f"the CouchDB of site {site.name} at {site.couch_url}" if site is not None
                 else "CouchDB")
        return (f"cannot reach {where}: {cause} (is it running? "
                "`jobdist cluster status` shows the local sites)")
    if error.status == 401:
        return (f"{text} (check the site's credentials: the file its config's "
                "couch.credentials names, or $JOBDIST_COUCH_USER and $JOBDIST_COUCH_PASSWORD)")
    if isinstance(error, NotFound) and (
        "Database does not exist" in text or "no_db_file" in text
        or error.reason in ("missing", "deleted", "missing_named_view")
    ):
        return f"{text} (run `jobdist setup` to create the database and its views)"
    return text


# --- sites -------------------------------------------------------------------------

sites_option = click.option(
    "--sites", "sites_dir", default="sites", show_default=True, envvar="JOBDIST_SITES",
    type=click.Path(path_type=Path), help="Directory of site configs ($JOBDIST_SITES).")
site_option = click.option(
    "--site", "--at", "site_name", default=None, envvar="JOBDIST_SITE", metavar="SITE",
    help="The site whose CouchDB to talk to ($JOBDIST_SITE; default: global, or the only "
         "site).")


def load_site_configs(sites_dir: Path) -> dict[str, SiteConfig]:
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


def site_couch(site: SiteConfig, *, quick: bool = False) -> Couch:
    """A connection for a command: a few quick retries, not the daemon's patience."""
    if quick:
        return Couch(site.couch_url, user=site.user, password=site.password,
                     timeout=3.0, retries=1, retry_time=1.0)
    return Couch(site.couch_url, user=site.user, password=site.password,
                 timeout=15.0, retries=2, retry_time=3.0)


def open_site(sites_dir: Path, name: str | None) -> tuple[SiteConfig, Database]:
    return connect(pick_site(load_site_configs(sites_dir), name))


def connect(site: SiteConfig) -> tuple[SiteConfig, Database]:
    """The site's jobs database, for the command under way (its errors name the site)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[SITE_META] = site
    return site, site_couch(site).database(site.database)


def read_merged(db: Database, site: SiteConfig, job_id: str) -> tuple[Doc, list[Doc]]:
    """The job merged from all its live leaves, and the leaves; a CliError when absent."""
    leaves = [leaf for leaf in db.leaves(job_id) if leaf.get("type") == "job"]
    if not leaves:
        raise CliError(f"no job {job_id!r} at site {site.name}")
    return core.merge(leaves), leaves


# --- output helpers ------------------------------------------------------------------

def make_console() -> Console:
    """Rich output on stdout; wide when it is not a terminal, so rows stay one line."""
    out = sys.stdout
    terminal = out.isatty()
    return Console(file=out, width=None if terminal else 200, highlight=False,
                   soft_wrap=not terminal)


def short_time(value: str | None) -> str:
    return value[:19].replace("T", " ") if value else "-"


def plain(value: Any) -> Text:
    """User data as text, never as rich markup."""
    return Text("-" if value is None or value == "" else str(value))


def target_text(target: Any) -> str:
    return ",".join(target) if isinstance(target, list) else str(target)


def step_state(doc: Doc, index: int) -> str:
    step = doc["job"][index]
    phase = step_phase(step)
    status = doc.get("job_status")
    if status == "cancelled" and index == doc["step"]:
        return "cancelled"  # (a run it killed is recorded as failed in the step)
    if phase == Phase.DONE:
        return str(step["step_status"])
    if status is not None and index >= doc["step"]:
        return "not run"
    if index > doc["step"]:
        return "waiting"
    return {Phase.OPEN: "open", Phase.CLAIMED: "claimed", Phase.WON: "won",
            Phase.RUNNING: "running"}[phase]


def step_where(step: Doc) -> str:
    if step.get("executioner"):
        return str(step["executioner"])
    if step.get("winner"):
        return str(step["winner"])
    if step.get("claimed_by"):
        return f"{step['claimed_by']} (claim)"
    return "-"


def job_status_text(doc: Doc) -> str:
    status = doc.get("job_status")
    if status is not None:
        return str(status)
    return f"live, step {doc['step'] + 1} of {len(doc['job'])}"


# How each table gives way in a narrow terminal (jobdist/tables.py): ids, statuses and
# counts keep their width; times, targets, places and commands wrap (in the one-line
# summaries of `list` and `watch`, commands are shortened with "…"); the least useful
# columns are left out, the highest `drop` first, only when even wrapping is not enough
# (at 80 columns, FINISHED alone: the start plus TOOK gives it).
STEP_COLUMNS = (
    Col("#"), Col("STATUS"), Col("TARGET", floor=6), Col("WHERE", floor=8),
    Col("TRIES", drop=3), Col("EXIT"), Col("STARTED", floor=10, at_once=True, drop=1),
    Col("FINISHED", floor=10, at_once=True, drop=4), Col("TOOK", drop=2),
    Col("COMMAND", floor=10),
)
HISTORY_COLUMNS = (
    Col("AT", floor=10, at_once=True), Col("EVENT"), Col("STEP"), Col("SITE", floor=6),
    Col("WORKER", floor=8, drop=1), Col("EPOCH", drop=2), Col("DETAIL", floor=10),
)
LIST_COLUMNS = (
    Col("JOB"), Col("STATUS"), Col("STEP"), Col("CREATOR", floor=6, drop=1),
    Col("PRIO", drop=2), Col("CREATED", floor=10, at_once=True),
    Col("UPDATED", floor=10, at_once=True, drop=3), Col("COMMAND", floor=10, cut=True),
)
WATCH_SITE_COLUMNS = (
    Col("SITE"), Col("COUCHDB", floor=10), Col("WORKERS BUSY"),
    *(Col(s.upper()) for s in STATUSES),
)
WATCH_RUNNING_COLUMNS = (
    Col("SITE", drop=1), Col("WORKER", floor=8), Col("JOB"), Col("STEP"),
    Col("SINCE", floor=10, at_once=True), Col("COMMAND", floor=10, cut=True),
)


def steps_table(doc: Doc) -> FittedTable:
    rows: list[list[Cell]] = []
    for index, step in enumerate(doc["job"]):
        took = step.get("exec_time")
        rows.append([
            str(index), step_state(doc, index), plain(", ".join(targets(step))),
            plain(step_where(step)), str(step.get("attempts", 0)), plain(step.get("exit_code")),
            short_time(step.get("start_time")), short_time(step.get("finish_time")),
            "-" if took is None else f"{took:.1f}s", plain(step["do"]),
        ])
    return FittedTable(STEP_COLUMNS, rows, title="steps")


def lost_claims(history: list[Doc]) -> set[str]:
    """The claims another site's win or start in a later epoch overtook, as keys.

    Merged from concurrent branches, such a claim is often dated after the start
    that beat it: shown as a plain "claimed" it reads like a second run.
    """
    winners = {(entry.get("step"), entry.get("epoch")):
               str(entry.get("detail") or "").removeprefix("winner ")
               for entry in history if entry.get("event") == "won"}
    decided = [(entry.get("step"), epoch, entry.get("site")) for entry in history
               if entry.get("event") in ("won", "started")
               and isinstance(epoch := entry.get("epoch"), int)]
    lost = set()
    for entry in history:
        step, epoch, site = entry.get("step"), entry.get("epoch"), entry.get("site")
        if entry.get("event") != "claimed" or not isinstance(epoch, int):
            continue
        overtaken = any(s == step and e > epoch and who != site for s, e, who in decided)
        if winners.get((step, epoch + 1)) != site and overtaken:
            lost.add(json.dumps(entry, sort_keys=True))
    return lost


def event_name(entry: Doc, lost: set[str]) -> Text:
    if entry.get("event") == "claimed" and json.dumps(entry, sort_keys=True) in lost:
        return Text("claim lost")
    return plain(entry.get("event"))


def history_table(doc: Doc) -> FittedTable:
    history = doc.get("history", [])
    lost = lost_claims(history)
    rows: list[list[Cell]] = [
            [short_time(entry.get("at")), event_name(entry, lost), plain(entry.get("step")),
             plain(entry.get("site")), plain(entry.get("worker")), plain(entry.get("epoch")),
             plain(entry.get("detail"))] for entry in history]
    return FittedTable(HISTORY_COLUMNS, rows, title="history")


def created_text(doc: Doc) -> str:
    if doc["created_at"] is None:  # written over HTTP, and its creator has not seen it yet
        return "- (not yet accepted by its creator)"
    return short_time(doc["created_at"])


def job_header(doc: Doc, leaves: int, site: str) -> Text:
    conflicts = leaves - 1
    title = Text(doc["_id"], style="bold")
    if conflicts:
        plural = "revision" if conflicts == 1 else "revisions"
        title.append(f"  ({conflicts} conflicting {plural}, merged)", style="yellow")
    lines = [
        title,
        Text(f"status   {job_status_text(doc)}"),
        Text(f"creator  {doc['creator']}   priority {doc['priority']}   as seen at {site}"),
        Text(f"created  {created_text(doc)}   updated {short_time(doc['updated_at'])}"),
        Text(f"rev      {doc['_rev']}"),  # its own line: a revision is 34 characters
    ]
    return Text("\n").join(lines)


# --- the command group ------------------------------------------------------------


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
@click.option("--journal", type=click.Path(path_type=Path),
              help="Keep results CouchDB did not take here (default: [daemon] journal).")
def site_run(config_path: Path, sites_dir: Path | None, ready_file: Path | None,
             log_file: Path | None, log_level: str, journal: Path | None) -> None:
    """Run the daemon of one site until SIGTERM or SIGINT."""
    from jobdist.daemon import Daemon, configure_logging

    config = load_site(config_path)
    if journal is not None:
        config = replace(config, journal=journal)
    known = set(load_sites(sites_dir or config_path.parent))
    configure_logging(log_level.upper(), log_file)
    sys.exit(Daemon(config, known).run(ready_file))


# --- submit ------------------------------------------------------------------------


@main.command()
@click.argument("file", required=False)
@click.option("--format", "file_format", type=click.Choice(["auto", "json", "yaml"]),
              default="auto", show_default=True,
              help="How FILE is written; auto: by its extension (.json, .yaml, .yml), "
                   "else JSON when it starts with { or [, else YAML.")
@click.option("--step", "steps", multiple=True, metavar="CMD",
              help="A step's shell command; repeat for more steps, run in order.")
@click.option("--target", "targets", multiple=True, metavar="SITES",
              help="Where the step at the same position may run: a site, a comma-separated "
                   "list of sites, or any. Give none (all any) or one per --step.")
@click.option("--retries", "retries", multiple=True, type=click.IntRange(min=0), metavar="N",
              help="Retries after a failed attempt: once for every step, or one per --step.")
@click.option("--timeout", "timeouts", multiple=True, type=click.FloatRange(min=0, min_open=True),
              metavar="S", help="Seconds an attempt may run: once for every step, or one per "
                                "--step.")
@click.option("--alt", "alts", multiple=True, metavar="CMD",
              help="Command run when the step's command failed after its retries: once for "
                   "every step, or one per --step.")
@click.option("--priority", type=int, default=None,
              help="Higher runs first (default 0; overrides the file's).")
@click.option("--wait", is_flag=True,
              help="Follow the job until it ends; exit 0 on success, 1 if it failed or was "
                   "cancelled.")
@click.option("--dry-run", is_flag=True, help="Print the job as it would be submitted; "
                                              "submit nothing.")
@sites_option
@site_option
def submit(file: str | None, file_format: str, steps: tuple[str, ...],
           targets: tuple[str, ...], retries: tuple[int, ...], timeouts: tuple[float, ...],
           alts: tuple[str, ...], priority: int | None, wait: bool, dry_run: bool,
           sites_dir: Path, site_name: str | None) -> None:
    """Submit a job at a site and print its id.

    The job comes from FILE (JSON or YAML, `-` for stdin), or from --step
    options, e.g.

      jobdist submit --step 'make' --target reg_a --step 'make test' --target any --retries 2

    Targets are checked against the sites directory; every validation error
    is printed on a line of its own (exit 2).
    """
    if file is not None and steps:
        raise CliError("give a job FILE or --step options, not both")
    if file is None and not steps:
        raise CliError("nothing to submit: give a job FILE (`-` for stdin) or --step CMD")
    if file is not None:
        if targets or retries or timeouts or alts:
            raise CliError("--target, --retries, --timeout and --alt go with --step, "
                           "not with a job FILE")
        submission = read_job_file(file, file_format)
        if priority is not None and isinstance(submission, dict):
            submission["priority"] = priority
    else:
        submission = submission_from_flags(steps, targets, retries, timeouts, alts, priority)
    sites = load_site_configs(sites_dir)
    errors = validate_submission(submission) + unknown_targets(submission, sites)
    if errors:
        raise CliError(*errors)
    site, db = open_site(sites_dir, site_name)
    job = job_from_submission(submission, site.name)
    errors = validate_job(job)
    if errors:
        raise CliError(*errors)
    if dry_run:
        click.echo(json.dumps(job, indent=2))
        return
    if isinstance(db.save(job), Conflict):
        raise CliError(f"a job with id {job['_id']!r} exists at site {site.name} already")
    click.echo(job["_id"])
    if wait:
        final = follow_job(db, site, job["_id"])
        sys.exit(0 if final["job_status"] == "success" else EXIT_JOB_NOT_OK)


def per_step(name: str, values: tuple[Any, ...], count: int, *, once_for_all: bool) -> list[Any]:
    """A per-step option's value for each step: none, once for all, or one per step."""
    if not values:
        return [None] * count
    if len(values) == count:
        return list(values)
    if once_for_all and len(values) == 1:
        return [values[0]] * count
    allowed = "once for every step or once per --step" if once_for_all else "once per --step"
    raise CliError(f"{name} is given {len(values)} times for {count} steps: give it {allowed}")


def parse_target(text: str) -> str | list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise CliError(f"--target {text!r}: name a site, a comma-separated list, or any")
    return names[0] if len(names) == 1 else names


def submission_from_flags(steps: tuple[str, ...], targets: tuple[str, ...],
                          retries: tuple[int, ...], timeouts: tuple[float, ...],
                          alts: tuple[str, ...], priority: int | None) -> Doc:
    count = len(steps)
    step_targets = per_step("--target", targets, count, once_for_all=False)
    step_retries = per_step("--retries", retries, count, once_for_all=True)
    step_timeouts = per_step("--timeout", timeouts, count, once_for_all=True)
    step_alts = per_step("--alt", alts, count, once_for_all=True)
    job = []
    for index, command in enumerate(steps):
        target = step_targets[index]
        job.append({
            "target": "any" if target is None else parse_target(target),
            "do": command,
            "alt_do": step_alts[index],
            "timeout": step_timeouts[index],
            "retry_strategy": {"max_retries": step_retries[index] or 0},
        })
    return {"job": job, "priority": priority or 0}


def unknown_targets(submission: Any, sites: dict[str, SiteConfig]) -> list[str]:
    """Steps that name a site the sites directory does not know: nobody could run them."""
    if not isinstance(submission, dict) or not isinstance(submission.get("job"), list):
        return []
    errors = []
    for index, step in enumerate(submission["job"]):
        target = step.get("target") if isinstance(step, dict) else None
        names = target if isinstance(target, list) else [target]
        unknown = [n for n in names if isinstance(n, str) and n != "any" and n not in sites]
        if unknown:
            errors.append(f"job[{index}].target: unknown site {', '.join(map(repr, unknown))}; "
                          f"known: {', '.join(sorted(sites))}")
    return errors


def follow_job(db: Database, site: SiteConfig, job_id: str, interval: float = 0.5) -> Doc:
    """Show the job's progress until it ends (a live table on a terminal, event lines
    otherwise); return its final merged document."""
    console = make_console()
    seen: set[str] = set()
    try:
        doc, _ = read_merged(db, site, job_id)
        if console.is_terminal:
            with Live(progress_view(doc), console=console, refresh_per_second=4) as live:
                while doc["job_status"] is None:
                    time.sleep(interval)
                    doc, _ = read_merged(db, site, job_id)
                    live.update(progress_view(doc))
        else:
            while True:
                for entry in doc.get("history", []):
                    key = json.dumps(entry, sort_keys=True)
                    if key not in seen:
                        seen.add(key)
                        click.echo(event_line(entry))
                if doc["job_status"] is not None:
                    break
                time.sleep(interval)
                doc, _ = read_merged(db, site, job_id)
    except KeyboardInterrupt:
        click.echo(f"stopped following {job_id}; the job goes on: jobdist show {job_id}",
                   err=True)
        sys.exit(EXIT_INTERRUPTED)
    click.echo(f"{job_id}: {doc['job_status']}{failure_reason(doc)}")
    return doc


def progress_view(doc: Doc) -> Group:
    done = sum(1 for step in doc["job"] if step_phase(step) == Phase.DONE)
    total = len(doc["job"])
    width = 30
    filled = math.floor(width * done / total)
    bar = Text("[" + "#" * filled + "." * (width - filled) + f"] {done}/{total} steps  ")
    bar.append(job_status_text(doc), style="bold")
    return Group(bar, steps_table(doc))


def event_line(entry: Doc) -> str:
    who = entry.get("worker") or entry.get("site") or "-"
    detail = f": {entry['detail']}" if entry.get("detail") else ""
    return (f"{short_time(entry.get('at'))}  step {entry.get('step')}  {entry.get('event')}  "
            f"{who}{detail}")


def failure_reason(doc: Doc) -> str:
    if doc.get("job_status") != "failed":
        return ""
    for entry in reversed(doc.get("history", [])):
        if entry.get("event") == "failed":
            return f" (step {entry.get('step')}: {entry.get('detail') or 'failed'})"
    return ""


# --- reading job files ------------------------------------------------------------------


def read_job_file(file: str, file_format: str = "auto") -> Any:
    """A submission from a JSON or YAML file (`-`: stdin), as plain JSON values."""
    try:
        data = read_stdin() if file == "-" else Path(file).read_bytes()
    except OSError as error:
        raise UnreadableFile(f"{file}: cannot read: {error.strerror or error}") from None
    if file_format == "auto":
        file_format = guess_format(file, data)
    if file_format == "json":
        try:
            return parse_json(data)
        except UnreadableFile as error:
            raise UnreadableFile(f"{file}: {error}") from None
    try:
        return parse_yaml(data)
    except UnreadableFile as error:
        raise UnreadableFile(f"{file}: {error}") from None


def read_stdin() -> bytes:
    """Standard input as bytes: the text stream's buffer (what click.get_binary_stream
    returned, without the call newer Click deprecates)."""
    if sys.stdin is None:  # started without one
        raise OSError("no standard input")
    return sys.stdin.buffer.read()


def guess_format(file: str, data: bytes) -> str:
    suffix = Path(file).suffix.lower() if file != "-" else ""
    if suffix == ".json":
        return "json"
    if suffix in (".yaml", ".yml"):
        return "yaml"
    start = data.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    return "json" if start in (b"{", b"[") else "yaml"


def parse_json(data: bytes) -> Any:
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


def parse_yaml(data: bytes) -> Any:
    import yaml

    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UnreadableFile("not valid YAML: not UTF-8 text") from None
    try:
        value = yaml.load(text, Loader=_job_yaml_loader())  # a SafeLoader
    except RecursionError:
        raise UnreadableFile("not valid YAML: nested too deeply") from None
    except yaml.YAMLError as error:
        raise UnreadableFile(f"not valid YAML: {describe_yaml_error(error)}") from None
    problem = non_json_value(value, "")
    if problem:
        raise UnreadableFile(f"not a JSON value in YAML: {problem}")
    return value


def describe_yaml_error(error: Exception) -> str:
    """`line L, column C: problem (context)` on one line, without PyYAML's source excerpt."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None)
    if problem is None:
        return " ".join(str(error).split())
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context = getattr(error, "context", None)
    return " ".join(f"{where}{problem}{f' ({context})' if context else ''}".split())


def _job_yaml_loader() -> type:
    """SafeLoader without timestamps: `2026-01-01` stays text, as in JSON."""
    import yaml

    class JobLoader(yaml.SafeLoader):
        pass

    JobLoader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers
                if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return JobLoader


def non_json_value(value: Any, path: str) -> str | None:
    """Where a YAML value has something JSON cannot hold (a binary, a set, .nan...)."""
    if value is None or isinstance(value, bool | int | str):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path or 'the document'}: {value} is not a " \
                                                 "JSON number"
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = non_json_value(item, f"{path}[{index}]")
            if found:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path or 'the document'}: key {key!r} is not a string (quote it)"
            found = non_json_value(item, f"{path}.{key}" if path else key)
            if found:
                return found
        return None
    return f"{path or 'the document'}: a {type(value).__name__} is not a JSON value"


# --- show, logs ---------------------------------------------------------------------------


@main.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True,
              help="Print the merged document (with `_conflicts` when there are).")
@sites_option
@site_option
def show(job_id: str, as_json: bool, sites_dir: Path, site_name: str | None) -> None:
    """Show a job as a site sees it: its steps and history, merged from all its
    conflicting revisions (as the daemons merge them)."""
    site, db = open_site(sites_dir, site_name)
    doc, leaves = read_merged(db, site, job_id)
    if as_json:
        if len(leaves) > 1:
            doc["_conflicts"] = sorted(leaf["_rev"] for leaf in leaves
                                       if leaf["_rev"] != doc["_rev"])
        doc = {"_id": doc.pop("_id"), "_rev": doc.pop("_rev"), **doc}
        click.echo(json.dumps(doc, indent=2, ensure_ascii=False))
        return
    console = make_console()
    console.print(job_header(doc, len(leaves), site.name))
    console.print()
    console.print(steps_table(doc))
    console.print()
    console.print(history_table(doc))


@main.command()
@click.argument("job_id")
@click.option("--step", "only_step", type=int, default=None, help="Only this step (from 0).")
@sites_option
@site_option
def logs(job_id: str, only_step: int | None, sites_dir: Path, site_name: str | None) -> None:
    """Print each step's output: the last 4 KiB of stdout and stderr."""
    site, db = open_site(sites_dir, site_name)
    doc, _ = read_merged(db, site, job_id)
    indexes = range(len(doc["job"]))
    if only_step is not None:
        if only_step not in indexes:
            raise CliError(f"job {job_id} has steps 0 to {len(doc['job']) - 1}, "
                           f"not {only_step}")
        indexes = range(only_step, only_step + 1)
    for index in indexes:
        step = doc["job"][index]
        exit_code = "" if step.get("exit_code") is None else f", exit {step['exit_code']}"
        click.echo(f"== step {index} ({step_state(doc, index)}{exit_code}, "
                   f"{step_where(step)}): {step['do']}")
        output = step.get("output")
        if not output:
            click.echo("(no output recorded)")
            continue
        for stream in ("stdout", "stderr"):
            text = output.get(stream) or ""
            click.echo(f"-- {stream}" + ("" if text else ": (empty)"))
            if text:
                click.echo(text, nl=not text.endswith("\n"))


# --- list -------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRow:
    id: str
    status: str
    creator: str
    priority: int
    step: int
    steps: int
    created_at: str
    updated_at: str
    command: str

    def as_json(self) -> Doc:
        return dict(self.__dict__)


def row_from_summary(doc_id: str, created_at: str, value: Doc) -> JobRow:
    return JobRow(doc_id, value.get("status") or "live", str(value.get("creator")),
                  int(value.get("priority") or 0), int(value.get("step") or 0),
                  int(value.get("steps") or 0), created_at, str(value.get("updated_at") or ""),
                  str(value.get("command")))


def summary_of(doc: Doc) -> Doc:
    """What the by_creator and by_site views emit as a row's value."""
    steps = doc.get("job") or [{}]
    current = steps[min(doc.get("step", 0), len(steps) - 1)]
    return {"status": doc.get("job_status") or "live", "creator": doc.get("creator"),
            "priority": doc.get("priority"), "step": doc.get("step"), "steps": len(steps),
            "updated_at": doc.get("updated_at"), "command": str(current.get("do"))[:120]}


def list_jobs(db: Database, *, status: str | None = None, creator: str | None = None,
              site: str | None = None, before: str | None = None,
              page_size: int = 100) -> Iterator[JobRow]:
    """Jobs newest first, read a page at a time from a view, never all at once.

    One descending key range per status (the views key on [..., status,
    created_at]), merged by creation time. --site reads `by_site`, --creator
    `by_creator`, otherwise `by_status` with the documents; a creator given
    with a site is checked on the rows.
    """
    statuses = [status] if status else list(STATUSES)
    if site is not None:
        view, prefix = "by_site", [site]
    elif creator is not None:
        view, prefix = "by_creator", [creator]
    else:
        view, prefix = "by_status", []
    if site is not None and creator is not None:
        page_size = 200  # rows of other creators are skipped: read more at a time
    streams = [_view_rows(db, view, [*prefix, name], before, page_size) for name in statuses]
    rows = heapq.merge(*streams, key=lambda row: (row.created_at, row.id), reverse=True)
    for row in rows:
        if site is not None and creator is not None and row.creator != creator:
            continue
        yield row


def _view_rows(db: Database, view: str, prefix: list[Any], before: str | None,
               page_size: int = 100) -> Iterator[JobRow]:
    params: dict[str, Any] = {"descending": True, "endkey": prefix,
                              "startkey": [*prefix, before if before else {}]}
    if view == "by_status":
        params |= {"include_docs": True, "reduce": False}
    for row in db.iter_view(DDOC, view, page_size=page_size, **params):
        created_at = row["key"][-1]
        if before and created_at >= before:
            continue
        if view == "by_status":
            if not row.get("doc"):
                continue
            yield row_from_summary(row["id"], created_at, summary_of(normalise(row["doc"])))
        else:
            yield row_from_summary(row["id"], created_at, row["value"] or {})


def list_row(row: JobRow) -> list[Cell]:
    step = "-" if row.status != "live" else f"{row.step + 1}/{row.steps}"
    return [row.id, row.status, step, plain(row.creator), str(row.priority),
            short_time(row.created_at), short_time(row.updated_at), plain(row.command)]


TIME_PREFIX = re.compile(r"^\d{4}(-\d{2}(-\d{2}([T ][0-9:.]*Z?)?)?)?$")


@main.command("list")
@click.option("--status", type=click.Choice(STATUSES), help="Only jobs in this state.")
@click.option("--site", "involving", metavar="SITE",
              help="Only jobs that concern SITE: a step targets it by name (alone or in a "
                   "list; `any` names no site), was won by it or was started there.")
@click.option("--creator", metavar="SITE", help="Only jobs created at SITE.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True,
              help="Show at most this many jobs.")
@click.option("--before", metavar="TIME",
              help="Only jobs created before TIME (ISO 8601 UTC, or a prefix such as "
                   "2026-11-22): the next page after a listing's last job.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per job, one a line.")
@sites_option
@click.option("--at", "site_name", default=None, envvar="JOBDIST_SITE", metavar="SITE",
              help="The site whose CouchDB to ask ($JOBDIST_SITE; default: global, or the "
                   "only site). Elsewhere --site, here --at: --site filters.")
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
    rows = list_jobs(db, status=status, creator=creator, site=involving, before=before,
                     page_size=min(limit + 1, 100))
    shown: list[JobRow] = []
    more = False
    for row in rows:
        if len(shown) == limit:
            more = True
            break
        shown.append(row)
    if as_json:
        for row in shown:
            click.echo(json.dumps(row.as_json()))
        return
    if not shown:
        click.echo(f"no jobs match at site {site.name}")
        return
    console = make_console()
    console.print(FittedTable(LIST_COLUMNS, [list_row(row) for row in shown]))
    if more:
        again = ["jobdist list"]
        for flag, value in (("--status", status), ("--site", involving),
                            ("--creator", creator)):
            if value:
                again.append(f"{flag} {value}")
        again.append(f"--before {shown[-1].created_at}")
        click.echo(f"{len(shown)} newest shown; older: {' '.join(again)}")


# --- cancel ------------------------------------------------------------------------------


WRITE_ATTEMPTS = 5  # cancel and adopt read again after a conflict, this many times


@main.command()
@click.argument("job_id")
@click.option("--reason", default=None, help="Why (kept in the job's history).")
@sites_option
@site_option
def cancel(job_id: str, reason: str | None, sites_dir: Path, site_name: str | None) -> None:
    """Cancel a job. The site running its current step sees the change on its
    feed and kills the step's process group. Exit 1 if the job had already
    ended otherwise."""
    site, db = open_site(sites_dir, site_name)
    reason = reason or f"cancelled by {operator_name()} from the command line"
    for _ in range(WRITE_ATTEMPTS):
        doc, leaves = read_merged(db, site, job_id)
        if doc["job_status"] == "cancelled":
            click.echo(f"{job_id} was cancelled already")
            return
        if doc["job_status"] is not None:
            click.echo(f"{job_id} already ended: {doc['job_status']}; nothing to cancel")
            sys.exit(EXIT_JOB_NOT_OK)
        plan = core.plan_cancel(leaves, core.Context(site=site.name, now=utc_now()), reason)
        if plan.doc is None:  # pragma: no cover - plan_cancel writes for every live job
            raise CliError(f"cannot cancel {job_id}: {plan.action}")
        # The creator's daemon deletes losing leaves once it has seen this write.
        if isinstance(db.save(plan.doc), Saved):
            step = doc["job"][doc["step"]]
            running = step_phase(step) in (Phase.WON, Phase.RUNNING)
            where = (f"; step {doc['step']} ({step['do']}) is running at {step_where(step)}, "
                     "which stops it when the change reaches it") if running else ""
            click.echo(f"cancelled {job_id} at site {site.name}{where}")
            return
        # Conflict: someone wrote since we read; read all leaves again and decide again.
    raise CliError(f"cannot cancel {job_id}: still conflicting after {WRITE_ATTEMPTS} tries; "
                   "try again")


@main.command()
@click.option("--from", "gone", required=True, metavar="SITE",
              help="The creator site that is gone for good.")
@click.option("--reason", default=None, help="Why (kept in each job's history).")
@click.option("--dry-run", is_flag=True, help="Count the jobs; change nothing.")
@sites_option
@site_option
def adopt(gone: str, reason: str | None, dry_run: bool, sites_dir: Path,
          site_name: str | None) -> None:
    """Make this site (--site) the creator of every live job that SITE created.

    For a creator site lost for good: without its creator a job's claims wait
    forever. Use it only once SITE is down for good or cut off: if SITE still
    runs behind a partition, both arbitrate until it sees the adoption, and a
    step may then run twice (in two epochs, recorded in the history)."""
    site, db = open_site(sites_dir, site_name)
    if gone == site.name:
        raise CliError(f"site {site.name} cannot adopt its own jobs: run this at another site "
                       "(--site)")
    reason = reason or f"adopted by {operator_name()} from the command line"
    ids = [row.id for row in list_jobs(db, status="live", creator=gone)]
    if dry_run:
        click.echo(f"{len(ids)} live jobs created by {gone} would be adopted by {site.name}")
        return
    adopted = sum(adopt_job(db, site, job_id, gone, reason) for job_id in ids)
    click.echo(f"{site.name} adopted {adopted} live jobs created by {gone}")


def adopt_job(db: Database, site: SiteConfig, job_id: str, gone: str, reason: str) -> bool:
    """Write one adoption, reading again after a conflict; False when nothing was due."""
    for _ in range(WRITE_ATTEMPTS):
        # Only the leaves a daemon would merge: an invalid one, or one that defines
        # another job, must not become the adopted job (the creator deletes those).
        leaves, _ = core.usable_leaves([leaf for leaf in db.leaves(job_id)
                                        if leaf.get("type") == "job"])
        plan = core.plan_adopt(leaves, core.Context(site=site.name, now=utc_now()), gone,
                               reason)
        if plan.doc is None:
            return False
        if isinstance(db.save(plan.doc), Saved):
            return True
    raise CliError(f"cannot adopt {job_id}: still conflicting after {WRITE_ATTEMPTS} tries; "
                   "run the command again")


def operator_name() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment
        return "an operator"


# --- watch -------------------------------------------------------------------------------


@dataclass
class SiteSnapshot:
    site: SiteConfig
    counts: dict[str, int]
    running: list[Doc]
    error: str | None = None


def snapshot_site(site: SiteConfig) -> SiteSnapshot:
    db = site_couch(site, quick=True).database(site.database)
    try:
        counts = {row["key"][0]: row["value"]
                  for row in db.view(DDOC, "by_status", group_level=1)}
        running = db.view(DDOC, "running", startkey=[site.name], endkey=[site.name, {}],
                          include_docs=True)
    except CouchError as error:
        return SiteSnapshot(site, {}, [], explain_couch_error(error, site))
    return SiteSnapshot(site, counts, running)


def watch_view(snapshots: list[SiteSnapshot]) -> Group:
    sites: list[list[Cell]] = []
    running: list[list[Cell]] = []
    errors = []
    for snap in snapshots:
        site = snap.site
        if snap.error:
            sites.append([site.name, site.couch_url, Text("unreachable", style="red"),
                          *("" for _ in STATUSES)])
            errors.append(Text(snap.error, style="red"))
            continue
        sites.append([site.name, site.couch_url, f"{len(snap.running)}/{site.workers}",
                      *(str(snap.counts.get(status, 0)) for status in STATUSES)])
        running += [running_row(site, row) for row in snap.running]
    parts: list[Any] = [FittedTable(WATCH_SITE_COLUMNS, sites,
                                    title=f"sites at {short_time(utc_now())} UTC"),
                        *errors, Text("")]
    parts.append(FittedTable(WATCH_RUNNING_COLUMNS, running, title="running steps")
                 if running else Text("no steps running"))
    return Group(*parts)


def running_row(site: SiteConfig, row: Doc) -> list[Cell]:
    doc = row.get("doc") or {}
    value = row.get("value") or {}
    index = value.get("step", 0)
    steps = doc.get("job") or []
    command = steps[index].get("do") if index < len(steps) else None
    return [site.name, plain(value.get("executioner")), row["id"], str(index),
            short_time(row["key"][1]), plain(command)]


@main.command()
@click.option("--once", is_flag=True, help="Print one snapshot and exit.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between refreshes.")
@sites_option
def watch(once: bool, interval: float, sites_dir: Path) -> None:
    """A live view of every site: jobs by status, busy workers and running steps.

    With --once, the exit status is 1 when a site's CouchDB did not answer."""
    sites = list(load_site_configs(sites_dir).values())

    def view() -> Group:
        return watch_view([snapshot_site(site) for site in sites])

    console = make_console()
    if once:
        snapshots = [snapshot_site(site) for site in sites]
        console.print(watch_view(snapshots))
        sys.exit(1 if any(snap.error for snap in snapshots) else 0)
    with contextlib.suppress(KeyboardInterrupt), \
            Live(view(), console=console, refresh_per_second=4) as live:
        while True:
            time.sleep(interval)
            live.update(view())


# --- setup -------------------------------------------------------------------------------


@main.command()
@sites_option
@click.option("--site", "only", multiple=True, metavar="SITE",
              help="Set up only this site (repeatable; default: every site).")
def setup(sites_dir: Path, only: tuple[str, ...]) -> None:
    """Create each site's database, upload its design documents, and write the
    replications the topology needs; remove stale `jobdist-*` replications.
    Idempotent: a second run changes nothing."""
    from jobdist.setup import setup_sites

    sites = load_site_configs(sites_dir)
    chosen = [pick_site(sites, name) for name in only] if only else list(sites.values())
    problems = []

    def problem(text: str) -> None:
        problems.append(text)
        click.echo(f"jobdist: {text}", err=True)

    changes = setup_sites(sites, chosen, report=click.echo, problem=problem,
                          warn=lambda text: click.echo(f"jobdist: {text}", err=True),
                          explain=site_error)
    if problems:
        sys.exit(EXIT_JOB_NOT_OK)
    click.echo(f"setup: {changes} changes" if changes else "setup: nothing to change")


@main.command()
@sites_option
@click.option("--compose-env", "compose_env", type=click.Path(path_type=Path),
              help="Also write docker-compose's variables (passwords, admin token) to this "
                   "env file, e.g. .env.")
def secrets(sites_dir: Path, compose_env: Path | None) -> None:
    """Write the credentials files the site configs name and nobody has written yet
    (random passwords, mode 600); existing ones are kept. `jobdist cluster up` does
    this by itself."""
    sites = load_site_configs(sites_dir)
    missing = [path for site in sites.values()
               for path in (site.credentials, site.admin_credentials)
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


@main.command()
@click.option("--older-than", "older_than", required=True, metavar="PERIOD",
              help="Remove finished jobs last updated longer ago than this: 90m, 12h, 30d, 2w.")
@click.option("--export", "export_path", type=click.Path(path_type=Path, dir_okay=False),
              help="First append each job (merged, one JSON object a line) to this file; "
                   "only exported jobs are removed.")
@click.option("--dry-run", is_flag=True, help="Count what would be removed; change nothing "
                                              "(and export nothing).")
@sites_option
@site_option
def cleanup(older_than: str, export_path: Path | None, dry_run: bool, sites_dir: Path,
            site_name: str | None) -> None:
    """Remove finished jobs (success, failed, cancelled) past a retention period.

    Deletes every revision of each such job at the site; replication carries
    the deletions to the other sites.
    """
    period = parse_duration(older_than)
    site, db = open_site(sites_dir, site_name)
    export = None
    if export_path is not None and not dry_run:
        try:
            export = export_path.open("a", encoding="utf-8")
        except OSError as error:
            raise CliError(f"{export_path}: cannot write: {error.strerror or error}") from None
    try:
        report = run_cleanup(db, period, export=export, dry_run=dry_run)
    except OSError as error:  # writing the export failed: nothing of that batch was deleted
        raise CliError(f"{export_path}: cannot write: {error.strerror or error}") from None
    finally:
        if export is not None:
            with contextlib.suppress(OSError):
                export.close()
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


# --- validate ----------------------------------------------------------------------------


@main.command()
@click.argument("file")
@click.option("--format", "file_format", type=click.Choice(["auto", "json", "yaml"]),
              default="auto", show_default=True,
              help="How FILE is written (auto: by extension, else by its first character).")
def validate(file: str, file_format: str) -> None:
    """Check the job in FILE (JSON or YAML, `-` for stdin) as it would be stored."""
    name = "<stdin>" if file == "-" else file
    try:
        doc = read_job_file(file, file_format)
    except UnreadableFile as problem:
        message = str(problem).removeprefix(f"{file}: ")
        click.echo(f"{name}: {message}", err=True)
        sys.exit(EXIT_UNREADABLE)
    errors = validate_submission(doc)
    for error in errors:
        click.echo(f"{name}: {error}")
    if errors:
        sys.exit(EXIT_INVALID)
    click.echo(f"{name}: ok")


if __name__ == "__main__":
    main(prog_name="jobdist")
