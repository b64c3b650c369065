"""`jobdist schedule`: jobs made at every tick of a cron expression, by one owner site."""

from __future__ import annotations

import json
from pathlib import Path

import click
from cronsim import CronSimError

from jobdist import client
from jobdist.clock import utc_now
from jobdist.config import SiteConfig
from jobdist.couch import Database
from jobdist.document_rules import MISSED_POLICIES
from jobdist.jobfile import job_submission, unknown_targets
from jobdist.render import make_console, plain, short_time
from jobdist.schedules import BadSchedule, new_schedule, next_ticks
from jobdist.tables import Cell, Col, FittedTable

from .common import (
    CliError,
    at_site,
    connect,
    known_site,
    load_site_configs,
    pick_site,
    site_option,
    sites_option,
    step_option,
    target_option,
)

SCHEDULE_COLUMNS = (
    Col("NAME"), Col("OWNER", floor=6), Col("CRON", floor=9), Col("TIME ZONE", floor=8, drop=2),
    Col("ENABLED"), Col("MISSED", drop=1), Col("NEXT TICK (UTC)", floor=10, at_once=True),
)


@click.group()
def schedule() -> None:
    """Jobs made on a schedule: at every tick of a cron expression, by one owner site."""


@schedule.command("add")
@click.argument("name")
@click.argument("file", required=False)
@click.option("--cron", required=True, metavar="EXPR",
              help='Five fields: minute hour day month weekday, e.g. "0 2 * * *".')
@click.option("--timezone", "timezone", default="UTC", show_default=True, metavar="ZONE",
              help="The time zone the cron expression is read in, e.g. Europe/Zurich.")
@click.option("--owner", metavar="SITE", help="The site that makes the jobs (default: --site).")
@click.option("--missed", type=click.Choice(MISSED_POLICIES), default="latest",
              show_default=True, help="Ticks missed while the owner was down: run the "
                                      "latest once, run all, or skip them.")
@step_option
@target_option
@click.option("--priority", type=int, default=None, help="The jobs' priority.")
@sites_option
@site_option
def add(name: str, file: str | None, cron: str, timezone: str, owner: str | None,
        missed: str, steps: tuple[str, ...], targets: tuple[str, ...], priority: int | None,
        sites_dir: Path, site_name: str | None) -> None:
    """Add schedule NAME: the job in FILE (or --step options) at every tick of --cron."""
    submission = job_submission(file, "auto", steps, targets, priority=priority)
    sites = load_site_configs(sites_dir)
    site = pick_site(sites, site_name)
    owner = known_site(sites, owner, "--owner").name if owner else site.name
    errors = unknown_targets(submission, sites)
    if errors:
        raise CliError(*errors)
    try:
        doc = new_schedule(name, cron, owner, submission, timezone=timezone, missed=missed)
    except BadSchedule as problem:
        raise CliError(*str(problem).split("; ")) from None
    _, db = connect(site)
    client.add_schedule(db, site.name, doc)
    click.echo(f"added schedule {name}: {owner} makes its job at {cron} ({timezone}); "
               f"next tick {short_time(next_tick(doc))} UTC")


@schedule.command("list")
@at_site
def list_schedules(site: SiteConfig, db: Database) -> None:
    """Every schedule, with its next tick."""
    rows = client.list_schedules(db)
    if not rows:
        click.echo(f"no schedules at site {site.name}")
        return
    make_console().print(FittedTable(SCHEDULE_COLUMNS, [schedule_row(row) for row in rows]))


def schedule_row(row: dict[str, object]) -> list[Cell]:
    enabled = bool(row["enabled"])
    return [str(row["name"]), plain(row["owner"]), plain(row["cron"]), plain(row["timezone"]),
            "yes" if enabled else "paused", plain(row["missed"]),
            short_time(next_tick(row)) if enabled else "-"]


def next_tick(doc: dict[str, object]) -> str | None:
    """The schedule's next tick from now, if its expression can be read."""
    try:
        return next(iter(next_ticks(doc, utc_now(), 1)), None)
    except (CronSimError, ValueError, KeyError):  # written elsewhere, unreadable here
        return None


@schedule.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the schedule document.")
@at_site
def show(name: str, as_json: bool, site: SiteConfig, db: Database) -> None:
    """A schedule, its job and its next ticks."""
    doc = client.read_schedule(db, site.name, name)
    if as_json:
        click.echo(json.dumps(doc, indent=2, ensure_ascii=False))
        return
    state = "enabled" if doc.get("enabled", True) else "paused"
    click.echo(f"{name}: {doc['cron']} ({doc.get('timezone', 'UTC')}), owner {doc['owner']}, "
               f"{state}, missed ticks: {doc.get('missed', 'latest')}")
    click.echo(f"changed  {short_time(doc['updated_at'])} UTC (no tick before it runs)")
    upcoming = next_ticks(doc, utc_now(), 5)
    click.echo("next     " + ", ".join(short_time(tick) for tick in upcoming) + " (UTC)")
    for index, step in enumerate(doc["job"]["job"]):
        click.echo(f"step {index}   {step.get('target', 'any')}: {step['do']}")


def enabler(name: str, enabled: bool, help_text: str) -> click.Command:
    """`pause` and `resume`: the same command but for the state it leaves."""

    @schedule.command(name, help=help_text)
    @click.argument("schedule_name", metavar="NAME")
    @at_site
    def command(schedule_name: str, site: SiteConfig, db: Database) -> None:
        client.set_schedule_enabled(db, site.name, schedule_name, enabled)
        click.echo(f"{'resumed' if enabled else 'paused'} schedule {schedule_name}")

    return command


pause = enabler("pause", False, "Stop making jobs; ticks while paused never run.")
resume = enabler("resume", True, "Make jobs again, from the next tick on.")


@schedule.command("remove")
@click.argument("name")
@at_site
def remove(name: str, site: SiteConfig, db: Database) -> None:
    """Remove a schedule; the jobs it made stay."""
    client.remove_schedule(db, site.name, name)
    click.echo(f"removed schedule {name}")
