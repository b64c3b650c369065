"""What a person reads: jobs, steps, histories, listings and errors, as rich text
and tables fitted to the terminal's width (`jobdist/tables.py`).

Pure functions of documents: the CLI prints them, the tests render them at a
chosen width. User data (commands, output, details) is always plain text,
never rich markup.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from typing import Any

from rich.console import Console, Group
from rich.text import Text

from jobdist.client import STATUSES, JobRow, SiteSnapshot
from jobdist.clock import utc_now
from jobdist.config import SiteConfig
from jobdist.couch import CouchError, NotFound, Unavailable
from jobdist.model import (
    Doc,
    Leaf,
    Phase,
    after_policy,
    dropped_sites,
    fan_out,
    is_waiting,
    step_phase,
    sub_runs,
    targets,
)
from jobdist.tables import Cell, Col, FittedTable

# What the error of a request that got no answer says, by what it means.
UNREACHABLE_CAUSES = (
    ("connection refused", ("connection refused", "errno 111")),
    ("timed out", ("timed out", "timeout")),
    ("unknown host", ("name or service not known", "failed to resolve", "nodename nor servname",
                      "name resolution")),
)


def explain_couch_error(error: CouchError, site: SiteConfig | None) -> str:
    """One line: what failed, at which site, and what to do about it when we know."""
    text = str(error)
    if isinstance(error, Unavailable) and error.status is None:  # no answer at all
        cause = next((cause for cause, signs in UNREACHABLE_CAUSES
                      if any(sign in text.lower() for sign in signs)), "no answer")
        where = (f"the CouchDB of site {site.name} at {site.couch.url}" if site is not None
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
        return "not started"  # ("waiting" is the word of a job that waits for others)
    return phase.name.lower()  # open, claimed, won or running


def progress_text(step: Leaf) -> str:
    """A step's last progress report as `40% copying volume 3`; "" when it has none."""
    report = step.get("progress")
    if not isinstance(report, dict) or not isinstance(report.get("fraction"), int | float):
        return ""
    percent = math.floor(report["fraction"] * 100 + 1e-9)  # 0.29 is 29%, not 28%
    return f"{percent}% {report.get('message') or ''}".strip()


def with_percent(state: str, record: Leaf) -> str:
    """A step's (or a sub-run's) state, with its percentage while it runs."""
    progress = progress_text(record)
    return f"{state} {progress.split(' ', 1)[0]}" if state == "running" and progress else state


def progress_lines(doc: Doc) -> list[Text]:
    """The header's `progress` line: the current step's last report, while the job runs."""
    step = doc["job"][doc["step"]] if doc["step"] < len(doc["job"]) else {}
    if doc.get("job_status") is not None or not progress_text(step):
        return []
    at = short_time(step["progress"].get("at"))
    return [Text(f"progress step {doc['step']}: {progress_text(step)}   (reported {at})")]


def progress_events(doc: Doc) -> list[str]:
    """`--wait`'s line for each progress report a step (or a broadcast step's part at a
    site) holds, in event_line's form."""
    records = [(index, where, record) for index, step in enumerate(doc["job"])
               for where, record in [("", step), *((f"  at {site}", run) for site, run
                                                    in sorted(sub_runs(step).items()))]]
    return [f"{short_time(record['progress'].get('at'))}  step {index}  progress  "
            f"{progress_text(record)}{where}"
            for index, where, record in records if progress_text(record)]


def step_where(step: Doc) -> str:
    counts = fan_out(step)
    if counts is not None:
        return f"{counts[0]}/{counts[1]} sites"
    claim = f"{step['claimed_by']} (claim)" if step.get("claimed_by") else "-"
    return str(step.get("executioner") or step.get("winner") or claim)


def job_status_text(doc: Doc) -> str:
    status = doc.get("job_status")
    if status is not None:
        return str(status)
    if is_waiting(doc):
        return "waiting (its creator starts it when the wait is over)"
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
    Col("SINCE", floor=10, at_once=True), Col("PROGRESS", floor=4, cut=True, drop=2),
    Col("COMMAND", floor=10, cut=True),
)


def steps_table(doc: Doc) -> FittedTable:
    rows: list[list[Cell]] = []
    for index, step in enumerate(doc["job"]):
        rows.append([str(index), with_percent(step_state(doc, index), step),
                     plain(", ".join(targets(step))), plain(step_where(step)),
                     *execution_cells(step, tries(doc, index)), plain(step["do"])])
        rows += sub_run_rows(doc, index)
    return FittedTable(STEP_COLUMNS, rows, title="steps")


def sub_run_status(step: Doc, site: str, run: Leaf) -> str:
    """A broadcast step's run at `site`: open (not started), running, finished, failed,
    or dropped (`jobdist drop-site`)."""
    return "dropped" if site in dropped_sites(step) else str(run.get("status") or "open")


def sub_run_rows(doc: Doc, index: int) -> list[list[Cell]]:
    """A broadcast step's sub-runs, a row per site under the step's own row."""
    step = doc["job"][index]
    return [["", with_percent(sub_run_status(step, site, run), run), plain(f"at {site}"),
             plain(run.get("executioner")), *execution_cells(run, tries(doc, index, site)), ""]
            for site, run in sorted(sub_runs(step).items())]


def tries(doc: Doc, index: int, site: str | None = None) -> int:
    """TRIES of step `index` (of its run at `site`, for a broadcast step): the attempts
    it made; while it runs, the try in progress: 1, plus each retry of this run (its
    epoch, at its site) the history holds. (`attempts` is written when a run ends.)"""
    step = doc["job"][index]
    record = sub_runs(step).get(site, {}) if site is not None else step
    running = record.get("status" if site is not None else "step_status") == "running"
    if not running or (site is None and sub_runs(step)):
        return int(record.get("attempts") or 0)
    where = site or str(record.get("executioner") or "").partition("/")[0]
    return 1 + sum(1 for entry in doc.get("history", [])
                   if entry.get("event") == "retried" and entry.get("step") == index
                   and entry.get("epoch") == record.get("epoch") and entry.get("site") == where)


def execution_cells(record: Leaf, tried: int) -> list[Cell]:
    """TRIES, EXIT, STARTED, FINISHED and TOOK of a step or a sub-run."""
    return [str(tried), plain(record.get("exit_code")),
            short_time(record.get("start_time")), short_time(record.get("finish_time")),
            took_text(record) or "-"]


def took_text(record: Leaf) -> str:
    """How long a step's (or a sub-run's) execution took, as `12.3s`; "" before it ends."""
    took = record.get("exec_time")
    return "" if took is None else f"{took:.1f}s"


def step_log(doc: Doc, index: int) -> str:
    """`jobdist logs`'s text for a step: a header, then its output; for a broadcast
    step, each site's run under a header of its own (status, exit code, time, worker)."""
    step = doc["job"][index]
    runs = sorted(sub_runs(step).items())
    text = (f"== step {index} ({step_state(doc, index)}{outcome_text(step)}, "
            f"{step_where(step)}): {step['do']}\n")
    if not runs:
        return text + output_text(step)
    for site, run in runs:
        worker = f", {run['executioner']}" if run.get("executioner") else ""
        text += (f"== step {index} at {site} ({sub_run_status(step, site, run)}"
                 f"{outcome_text(run)}{worker})\n{output_text(run)}")
    return text


def outcome_text(record: Leaf) -> str:
    """`, exit 0, took 1.2s`: what is known of how the execution ended."""
    exit_code, took = record.get("exit_code"), took_text(record)
    return ("" if exit_code is None else f", exit {exit_code}") + (f", took {took}" if took else "")


def output_text(record: Leaf) -> str:
    """The last 4 KiB of stdout and stderr the execution recorded, each under a line."""
    output = record.get("output")
    if not isinstance(output, dict) or not output:
        return "(no output recorded)\n"
    text = ""
    for stream in ("stdout", "stderr"):
        content = output.get(stream) or ""
        text += f"-- {stream}" + ("\n" if content else ": (empty)\n")
        text += content if not content or content.endswith("\n") else content + "\n"
    return text


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


def wait_lines(doc: Doc, awaited: Mapping[str, str | None], site: str) -> list[Text]:
    """What the job waits (or waited) for: each job with its status as `site` sees it,
    and its `not_before` time."""
    lines = []
    if awaited:
        jobs = ", ".join(f"{job_id} ({status or f'no such job at {site}'})"
                         for job_id, status in awaited.items())
        lines.append(Text(f"after    {jobs}   policy {after_policy(doc)}"))
    missing = [job_id for job_id, status in awaited.items() if status is None]
    if missing and is_waiting(doc):
        lines.append(Text(f"         {unknown_awaited_note(missing, site)}"))
    if doc.get("not_before"):
        lines.append(Text(f"not before {short_time(doc['not_before'])} UTC (its creator's clock)"))
    return lines


def unknown_awaited_note(missing: list[str], site: str) -> str:
    """What waiting for job ids the site does not have means: maybe a typo, maybe not yet."""
    ids = ", ".join(missing)
    return (f"{site} has no job {ids} (yet): this job waits until it has, and for ever if "
            "the id is wrong (then cancel this job)")


def job_header(doc: Doc, leaves: int, site: str,
               awaited: Mapping[str, str | None] | None = None) -> Text:
    conflicts = leaves - 1
    title = Text(doc["_id"], style="bold")
    if conflicts:
        plural = "revision" if conflicts == 1 else "revisions"
        title.append(f"  ({conflicts} conflicting {plural}, merged)", style="yellow")
    lines = [
        title,
        Text(f"status   {job_status_text(doc)}"),
        *progress_lines(doc),
        *wait_lines(doc, awaited or {}, site),
        Text(f"creator  {doc['creator']}   priority {doc['priority']}   as seen at {site}"),
        Text(f"created  {created_text(doc)}   updated {short_time(doc['updated_at'])}"),
        Text(f"rev      {doc['_rev']}"),  # its own line: a revision is 34 characters
    ]
    return Text("\n").join(lines)


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


def list_row(row: JobRow) -> list[Cell]:
    step = "-" if row.status not in ("live", "waiting") else f"{row.step + 1}/{row.steps}"
    if row.status == "live" and row.fan_out:
        step += f" ({row.fan_out} sites)"
    return [row.id, row.status, step, plain(row.creator), str(row.priority),
            short_time(row.created_at), short_time(row.updated_at), plain(row.command)]


def watch_view(snapshots: list[SiteSnapshot]) -> Group:
    sites: list[list[Cell]] = []
    running: list[list[Cell]] = []
    errors = []
    for snap in snapshots:
        site = snap.site
        if snap.error:
            sites.append([site.name, site.couch.url, Text("unreachable", style="red"),
                          *("" for _ in STATUSES)])
            errors.append(Text(explain_couch_error(snap.error, site), style="red"))
            continue
        sites.append([site.name, site.couch.url, f"{len(snap.running)}/{site.workers}",
                      *(str(snap.counts.get(status, 0)) for status in STATUSES)])
        running += [running_row(site, row) for row in snap.running]
    steps = (FittedTable(WATCH_RUNNING_COLUMNS, running, title="running steps") if running
             else Text("no steps running"))
    title = f"sites at {short_time(utc_now())} UTC"
    return Group(FittedTable(WATCH_SITE_COLUMNS, sites, title=title), *errors, Text(""), steps)


def running_row(site: SiteConfig, row: Doc) -> list[Cell]:
    doc = row.get("doc") or {}
    value = row.get("value") or {}
    index = value.get("step", 0)
    steps = doc.get("job") or []
    command = steps[index].get("do") if index < len(steps) else None
    return [site.name, plain(value.get("executioner")), row["id"], str(index),
            short_time(row["key"][1]), plain(progress_text(value) or "-"), plain(command)]

