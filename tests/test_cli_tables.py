"""The CLI's tables fit the terminal: at 80 columns nothing is cut, only wrapped or left out
by rule (jobdist/tables.py). Rendered with rich's own Console at fixed widths."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.cells import cell_len
from rich.console import Console

from jobdist import client
from jobdist import render as show
from jobdist.config import CouchSettings, SiteConfig
from jobdist.couch import Unavailable
from jobdist.model import Doc, event, new_job, new_step, new_sub_run
from jobdist.tables import Col, FittedTable, allot

T1 = "2026-11-22T00:35:12.123456Z"
T2 = "2026-11-22T00:35:24.654321Z"
COMMAND = "make -j8 all && make install PREFIX=/opt/thing DESTDIR=/tmp/stage"
JOB_ID = "job-20261122T003512.123456Z-3fa9c2d1"


def render(renderable: Any, width: int) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, highlight=False).print(renderable)
    return out.getvalue().splitlines()


def text_of(lines: list[str]) -> str:
    """The words of a rendering, wrapped lines joined: what a reader can find in it."""
    return " ".join(" ".join(lines).split())


def column_text(lines: list[str], header: str) -> str:
    """The last column's text, its wrapped lines joined, spaces left out."""
    start = lines[0].index(header)
    return "".join(line[start:].strip() for line in lines[1:]).replace(" ", "")


def shown_job() -> Doc:
    steps = [new_step(COMMAND, target=["reg_a", "reg_b"]), new_step("sleep 1"),
             new_step("echo done", target="reg_b")]
    doc = new_job("global", steps, created_at=T1, job_id=JOB_ID)
    doc["_rev"] = "7-abcdef0123456789abcdef0123456789"
    doc["job"][0].update(claimed_by="reg_a", winner="reg_a", executioner="reg_a/w1", epoch=1,
                         step_status="finished", exec_time=12.3456, start_time=T1,
                         finish_time=T2, attempts=3, exit_code=0)
    doc["job"][1].update(winner="reg_b", claimed_by="reg_b", executioner="reg_b/w2", epoch=2,
                         step_status="running", start_time=T2)
    doc["step"], doc["job_status"] = 1, "cancelled"
    doc["history"] += [
        event("started", step=0, site="reg_a", worker="reg_a/w1", epoch=1, at=T1),
        event("stale_finish", step=0, site="reg_b", worker="reg_b/w2", epoch=1, at=T2,
              detail="epoch 1 is no longer current: " + "a long reason " * 6),
        event("cancelled", step=1, site="global", at=T2, detail="operator asked"),
    ]
    return doc


def assert_fits(lines: list[str], width: int) -> None:
    too_wide = [line for line in lines if cell_len(line.rstrip()) > width]
    assert not too_wide, too_wide


@pytest.mark.parametrize("width", [80, 100])
def test_show_fits_keeping_every_status_number_and_command(width: int) -> None:
    doc = shown_job()
    lines = render(show.steps_table(doc), width) + render(show.history_table(doc), width)
    assert_fits(lines, width)
    header = lines[1].split()
    assert header[:2] == ["#", "STATUS"] and header[-1] == "COMMAND"
    words = text_of(lines)
    for status in ("finished", "cancelled", "not run"):
        assert f" {status} " in words
    assert "12.3s" in words and "reg_a/w1" in words and "stale_finish" in words
    steps = render(show.steps_table(doc), width)
    assert column_text(steps[1:], "COMMAND") == (COMMAND + "sleep1" + "echodone").replace(" ", "")
    assert "operator asked" in words and words.count("a long reason") == 6


def test_at_80_columns_finished_is_left_out_and_times_wrap_into_date_and_clock() -> None:
    lines = render(show.steps_table(shown_job()), 80)
    assert "FINISHED" not in lines[1] and "STARTED" in lines[1]
    started = lines[1].index("STARTED")
    assert lines[2][started:].startswith("2026-11-22 ")
    assert lines[3][started:].startswith("00:35:12 ")


def test_a_wide_terminal_shows_every_column_unwrapped() -> None:
    lines = render(show.steps_table(shown_job()), 200)
    assert lines[1].split() == ["#", "STATUS", "TARGET", "WHERE", "TRIES", "EXIT", "STARTED",
                                "FINISHED", "TOOK", "COMMAND"]
    assert len(lines) == 2 + 3  # title, header, one line a step
    assert "2026-11-22 00:35:24" in lines[2]


def test_the_wait_view_fits_80_columns() -> None:
    lines = render(show.progress_view(shown_job()), 80)
    assert_fits(lines, 80)
    assert "COMMAND" in lines[2] and "#" in lines[2]


def test_list_fits_80_columns_with_whole_ids() -> None:
    rows = [client.JobRow(JOB_ID, status, "global", 5, 0, 3, T1, T2, COMMAND)
            for status in ("live", "cancelled", "success")]
    lines = render(FittedTable(show.LIST_COLUMNS, [show.list_row(row) for row in rows]), 80)
    assert_fits(lines, 80)
    assert sum(JOB_ID in line for line in lines) == 3
    assert lines[0].split()[:3] == ["JOB", "STATUS", "STEP"] and "CREATED" in lines[0]
    assert " cancelled " in text_of(lines)


def test_watch_fits_80_columns(tmp_path: Any) -> None:
    site = SiteConfig(name="reg_a", couch=CouchSettings("http://127.0.0.1:5985"), workers=2)
    running = {"id": JOB_ID, "key": ["reg_a", T1], "value": {"step": 0,
               "executioner": "reg_a/w1"}, "doc": {"job": [{"do": COMMAND}]}}
    snapshot = client.SiteSnapshot(site, {"live": 3, "success": 120}, [running])
    down = client.SiteSnapshot(site, {}, [], error=Unavailable("connection refused"))
    lines = render(show.watch_view([snapshot, down]), 80)
    assert_fits(lines, 80)
    words = text_of(lines)
    assert JOB_ID in words and "unreachable" in words and "120" in words


# --- the layout rules --------------------------------------------------------------

COLUMNS = [Col("A"), Col("TIME", floor=10, at_once=True), Col("TEXT", floor=4),
           Col("EXTRA", drop=1)]


def test_allot_keeps_natural_widths_when_they_fit() -> None:
    assert allot(COLUMNS, [3, 19, 20, 5], 3 + 19 + 20 + 5 + 2 * 3) == [3, 19, 20, 5]


def test_allot_narrows_the_widest_wrapping_column_first() -> None:
    assert allot(COLUMNS, [3, 19, 30, 5], 60) == [3, 19, 27, 5]


def test_an_at_once_column_gives_all_and_the_surplus_goes_back() -> None:
    # TEXT (19) and TIME (19) tie at first, TEXT being later gives one cell; then TIME is
    # the widest and drops to 10 at once: 8 cells more than needed go back to TEXT.
    assert allot(COLUMNS, [3, 19, 20, 5], 40) == [3, 10, 16, 5]


def test_allot_gives_up_below_the_floors() -> None:
    assert allot(COLUMNS, [3, 19, 20, 5], 3 + 10 + 4 + 5 + 6 - 1) is None


def test_the_dropped_column_is_the_last_resort() -> None:
    table = FittedTable(COLUMNS, [["abc", "2026-11-22 00:35:12", "some words here", "extra"]])
    assert [c.header for c in table.layout(80).columns] == ["A", "TIME", "TEXT", "EXTRA"]
    assert [c.header for c in table.layout(26).columns] == ["A", "TIME", "TEXT"]


def test_a_broadcast_step_fits_80_columns_with_a_row_per_site() -> None:
    doc = new_job("global", [new_step(COMMAND, target="all"), new_step("verify")],
                  created_at=T1, job_id=JOB_ID)
    doc["_rev"] = "7-abc"
    snapshot = doc["job"][0]
    snapshot.update(step_status="running", start_time=T1, runs={
        site: {**new_sub_run(), "status": status, "epoch": 1 if status else 0,
               "executioner": f"{site}/w1" if status else None}
        for site, status in (("global", "finished"), ("reg_a", "running"), ("reg_b", None))})
    snapshot["runs"]["reg_a"]["progress"] = {"fraction": 0.4, "message": "copying", "at": T2}
    lines = render(show.steps_table(doc), 80)
    assert_fits(lines, 80)
    step_row = next(line for line in lines if line.lstrip().startswith("0 "))
    assert "1/3 sites" in step_row
    assert "running 40%" in next(line for line in lines if "at reg_a" in line)
    assert "open" in next(line for line in lines if "at reg_b" in line)
    assert show.progress_events(doc) == ["2026-11-22 00:35:24  step 0  progress  40% copying"
                                         "  at reg_a"]
    row = client.row_from_summary(JOB_ID, T1, client.summary_of(doc))
    assert show.list_row(row)[2] == "1/2 (1/3 sites)"


def test_logs_show_each_sites_run_of_a_broadcast_step() -> None:
    doc = new_job("global", [new_step("hostname", target="all"), new_step("true")],
                  created_at=T1, job_id=JOB_ID)
    doc["job"][0].update(step_status="finished", runs={
        "global": {**new_sub_run(), "status": "finished", "executioner": "global/w1",
                   "exit_code": 0, "exec_time": 0.51, "attempts": 1,
                   "output": {"stdout": "host-g\n", "stderr": ""}},
        "reg_a": {**new_sub_run(), "status": "failed", "executioner": "reg_a/w2",
                  "exit_code": 3, "exec_time": 1.25, "attempts": 2,
                  "output": {"stdout": "", "stderr": "no disk"}},
        "reg_b": new_sub_run()}, dropped=["reg_b"])
    doc["step"] = 1
    assert show.step_log(doc, 0).splitlines() == [
        "== step 0 (finished, 2/2 sites): hostname",
        "== step 0 at global (finished, exit 0, took 0.5s, global/w1)",
        "-- stdout", "host-g", "-- stderr: (empty)",
        "== step 0 at reg_a (failed, exit 3, took 1.2s, reg_a/w2)",
        "-- stdout: (empty)", "-- stderr", "no disk",
        "== step 0 at reg_b (dropped)", "(no output recorded)",
    ]
    assert show.step_log(doc, 1) == "== step 1 (open, -): true\n(no output recorded)\n"


def tries_cell(doc: Doc, row_start: str) -> str:
    """The TRIES cell of the steps table's row that starts with `row_start`."""
    lines = render(show.steps_table(doc), 200)
    column = lines[1].index("TRIES")
    row = next(line for line in lines if line.lstrip().startswith(row_start))
    return row[column:].split()[0]


def test_a_running_step_counts_the_try_in_progress() -> None:
    doc = new_job("global", [new_step("make", target="reg_a"), new_step("sync", target="all")],
                  created_at=T1, job_id=JOB_ID)
    doc["_rev"] = "3-abc"
    doc["job"][0].update(winner="reg_a", executioner="reg_a/w1", epoch=2,
                         step_status="running", start_time=T1)
    assert (show.tries(doc, 0), tries_cell(doc, "0 ")) == (1, "1")  # its first try
    retried = [event("retried", step=0, site="reg_a", worker="reg_a/w1", epoch=epoch, at=T2,
                     detail="attempt 1: exit 1") for epoch in (1, 2)]  # epoch 1: another run
    doc["history"] += retried
    assert (show.tries(doc, 0), tries_cell(doc, "0 ")) == (2, "2")
    doc["job"][0].update(step_status="finished", attempts=2, exit_code=0)
    assert show.tries(doc, 0) == 2  # ended: the attempts it made
    doc["step"] = 1
    doc["job"][1].update(step_status="running", runs={
        "reg_a": {**new_sub_run(), "status": "running", "epoch": 1, "executioner": "reg_a/w2"},
        "reg_b": new_sub_run()})
    assert [show.tries(doc, 1, site) for site in ("reg_a", "reg_b")] == [1, 0]
    assert tries_cell(doc, "running") == "1"  # the row at reg_a


def test_a_step_after_the_current_one_is_not_started_not_waiting() -> None:
    # "waiting" is what a job that waits for other jobs or a time is said to be.
    doc = new_job("global", [new_step("true"), new_step("true")])
    assert show.step_state(doc, 0) == "open"
    assert show.step_state(doc, 1) == "not started"
