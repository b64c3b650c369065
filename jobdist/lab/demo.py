"""`jobdist demo`: the thesis's evaluation (section 6) on local clusters, as a table."""

from __future__ import annotations

import sys

from rich.console import Group
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from ..cli.common import EXIT_INTERRUPTED
from ..render import make_console
from ..tables import Cell, Col, FittedTable
from .scenarios import THESIS_SCENARIOS, Result, check_ledger, run_scenario


def run_demo(step_seconds: float, only: tuple[str, ...] = ()) -> int:
    """Run the scenarios, print the table; the exit status. Interrupted (Ctrl-C, SIGTERM),
    it stops the running scenario's sites, prints what ran and says what it stopped."""
    console = make_console()  # 200 columns when not a terminal: one line a scenario
    chosen = [s for s in THESIS_SCENARIOS if not only or s.name.startswith(only)]
    console.print(f"[bold]jobdist demo[/]: the thesis's scenarios, steps of "
                  f"{step_seconds} s instead of 5 s, 2 workers a site, fresh local sites each")
    results: list[Result] = []
    problems: list[str] = []
    interrupted = None
    with Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("jobs"), TimeElapsedColumn(), console=console) as progress:
        for scenario in chosen:
            task = progress.add_task(scenario.name, total=scenario.jobs)

            def advance(done: int, task: TaskID = task) -> None:
                progress.update(task, completed=done)

            try:  # (its local sites are stopped on the way out, whatever happens)
                result = run_scenario(scenario, step_seconds, on_progress=advance)
            except KeyboardInterrupt:
                interrupted = scenario.name
                break
            results.append(result)
            problems += [f"{scenario.name}: {p}" for p in check_ledger(result)]
    if results:
        console.print(results_table(results))
    for problem in problems:
        console.print(f"[red]problem[/] {problem}")
    if interrupted is not None:
        print(f"jobdist: demo interrupted: stopped scenario {interrupted!r} and its local "
              f"sites; {len(results)} of {len(chosen)} scenarios ran", file=sys.stderr)
        return EXIT_INTERRUPTED
    failed = sum(r.statuses.get("failed", 0) + r.statuses.get("cancelled", 0) for r in results)
    return 1 if problems or failed else 0


COLUMNS = (
    Col("scenario", floor=12), Col("ok"), Col("makespan", justify="right"),
    Col("ideal", justify="right"), Col("ratio", justify="right"),
    Col("at 5 s", justify="right"), Col("thesis", justify="right"),
    Col("revs/job", floor=5),
)


def results_table(results: list[Result]) -> Group:
    """The results, and one line under them that says how to read them."""
    rows: list[list[Cell]] = [[
        r.scenario.name,
        f"{r.statuses.get('success', 0)}/{r.scenario.jobs}",
        f"{r.makespan:.2f}",
        f"{r.ideal:.2f}",
        f"{r.ratio:.2f}",
        f"{r.ratio_at_thesis_steps:.2f}",
        f"{r.thesis_ratio:.2f}",
        revisions_text(r),
    ] for r in results]
    step = f"{results[0].step_seconds:g} s" if results else "?"
    title = f"the thesis's scenarios at {step} steps, 2 workers a site; times in seconds"
    caption = Text("ratio = makespan ÷ ideal (the best schedule); at 5 s, the thesis's step: "
                   "ours (our overhead added to a 5 s ideal) and the thesis's; revs/job: "
                   "min-max (the thesis's)", style="dim")
    return Group(FittedTable(COLUMNS, rows, title=title), caption)


def revisions_text(result: Result) -> str:
    ours = f"{min(result.revisions)}-{max(result.revisions)}"
    theirs = result.scenario.thesis.revisions
    return ours + (f" ({theirs[0]}-{theirs[1]})" if theirs else "")
