"""`jobdist demo`: the thesis's evaluation (section 6) on local clusters, as a table."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from .scenarios import THESIS_SCENARIOS, Result, check_ledger, run_scenario


def run_demo(step_seconds: float, only: tuple[str, ...] = ()) -> int:
    console = Console()
    chosen = [s for s in THESIS_SCENARIOS if not only or s.name.startswith(only)]
    console.print(f"[bold]jobdist demo[/]: the thesis's scenarios, steps of "
                  f"{step_seconds} s instead of 5 s, 2 workers a site, fresh local sites each")
    results: list[Result] = []
    problems: list[str] = []
    with Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("jobs"), TimeElapsedColumn(), console=console) as progress:
        for scenario in chosen:
            task = progress.add_task(scenario.name, total=scenario.jobs)

            def advance(done: int, task: TaskID = task) -> None:
                progress.update(task, completed=done)

            result = run_scenario(scenario, step_seconds, on_progress=advance)
            results.append(result)
            problems += [f"{scenario.name}: {p}" for p in check_ledger(result)]
    console.print(results_table(results))
    for problem in problems:
        console.print(f"[red]problem[/] {problem}")
    failed = sum(r.statuses.get("failed", 0) + r.statuses.get("cancelled", 0) for r in results)
    return 1 if problems or failed else 0


def results_table(results: list[Result]) -> Table:
    table = Table(title="makespan / ideal: the ideal is the best any scheduler could do")
    for column in ("scenario", "makespan", "ideal", "ratio", "thesis formula",
                   "revs/job min/max", "jobs ok", "thesis (5 s steps)"):
        table.add_column(column)
    for r in results:
        table.add_row(
            r.scenario.name,
            f"{r.makespan:.2f} s",
            f"{r.ideal:.2f} s",
            f"{r.ratio:.2f}",
            f"{r.thesis_optimum:.2f} s",
            f"{min(r.revisions)}/{max(r.revisions)}",
            f"{r.statuses.get('success', 0)}/{r.scenario.jobs}",
            r.scenario.thesis,
        )
    return table
