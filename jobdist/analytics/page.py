"""`jobdist report`'s page and pipeline: charts and one self-contained HTML page from
the tables, and the pipeline from CouchDB to them."""

from __future__ import annotations

import base64
import html
import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Figure without pyplot: no global state and no GUI backend (the Agg canvas draws it).
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from py4j.protocol import Py4JError  # type: ignore[import-untyped]
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobdist.analytics.source import (
    CouchSource,
    list_job_ids,
    load_jobs,
    skipped_jobs,
    spark_failure,
    start_spark,
)
from jobdist.analytics.tables import TABLES, build_tables, counts, summarise, write_tables

HISTOGRAM_BINS = 30
SKIPPED_SHOWN = 20  # skipped jobs the page names (all are counted); the terminal names 3

Stage = Callable[[str], None]


# -- charts and the HTML page ----------------------------------------------------------


def histogram(df: DataFrame, column: str, low: float | None,
              high: float | None) -> tuple[list[float], list[int]]:
    """Bin edges and counts, binned by Spark; values past `high` land in the last bin."""
    if low is None or high is None:
        return [], []
    width = (high - low) / HISTOGRAM_BINS if high > low else 1.0
    bin_of = F.least(F.greatest(F.floor((F.col(column) - low) / width), F.lit(0)),
                     F.lit(HISTOGRAM_BINS - 1))
    found = {row["bin"]: row["count"] for row in
             df.where(F.col(column).isNotNull()).groupBy(bin_of.alias("bin")).count().collect()}
    return ([low + i * width for i in range(HISTOGRAM_BINS + 1)],
            [found.get(i, 0) for i in range(HISTOGRAM_BINS)])


def chart(draw: Callable[[Any], None], counting: bool = True) -> str:
    """A chart drawn by `draw` on fresh axes, as a PNG data URI."""
    figure = Figure(figsize=(7, 3.2))
    axes = figure.subplots()
    if counting:  # no "0.5 jobs" on a small run
        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    draw(axes)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def histogram_chart(df: DataFrame, column: str, spread: dict, low: float | None,
                    high: float | None, title: str) -> str:
    """The column's histogram from `low` to `high`, with its p50 and p95."""
    edges, bin_counts = histogram(df, column, low, high)
    marks = {"p50": spread["p50"], "p95": spread["p95"]}

    def draw(axes: Any) -> None:
        if bin_counts:
            axes.stairs(bin_counts, edges, fill=True, alpha=0.6)
        for (label, value), colour in zip(marks.items(), ("tab:orange", "tab:red"), strict=True):
            if value is not None:
                axes.axvline(value, color=colour, linestyle="--", label=f"{label} {value:.3f} s")
        if any(value is not None for value in marks.values()):
            axes.legend()
        axes.set(title=title, xlabel="seconds", ylabel="count")

    return chart(draw)


def bar_chart(bars: dict[str, float], title: str, ylabel: str, percent: bool = False) -> str:
    def draw(axes: Any) -> None:
        values = list(bars.values())
        drawn = axes.bar(list(bars), values, color="tab:blue")
        axes.bar_label(drawn, labels=[f"{v:.0%}" if percent else f"{v:g}" for v in values])
        axes.set(title=title, ylabel=ylabel)
        axes.set_ylim(0, max([1.0 if percent else 0.0, *values]) * 1.15 or 1.0)  # label room

    return chart(draw, counting=not percent)


def draw_charts(tables: dict[str, DataFrame], summary: dict) -> dict[str, str]:
    """The report's charts as PNG data URIs, by title."""
    makespan, overhead = summary["makespan_s"], summary["overhead_s"]
    revisions = sorted(counts(tables["jobs"], "revisions").items())
    return {
        "Makespan per job": histogram_chart(
            tables["jobs"], "makespan_s", makespan, makespan["min"], makespan["max"],
            "Makespan per job (first start to last finish)"),
        # The overhead axis stops at p99: one stuck step must not squeeze the rest into one bar.
        "Scheduling overhead per step": histogram_chart(
            tables["steps"], "overhead_s", overhead, min(overhead["min"] or 0.0, 0.0),
            overhead["p99"],
            "Scheduling overhead per step (runnable to start; steps past p99 in the last bar)"),
        "Utilisation per site": bar_chart(
            {site: s["utilisation"] or 0.0 for site, s in summary["sites"].items()},
            f"Utilisation per site ({summary['workers_per_site']} workers a site)",
            "busy / (workers x window)", percent=True),
        "Revisions per job": bar_chart(
            {str(count): jobs for count, jobs in revisions},
            "Revisions per job (replication cost)", "jobs"),
    }


def fmt(value: Any, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.1%}"


def seconds(spread: dict, *keys: str) -> str:
    """Some figures of a spread in seconds, as "p50 / max"."""
    return " / ".join(fmt(spread[key], " s") for key in keys)


def headline(summary: dict) -> list[tuple[str, str]]:
    """The figures at the top of the report, as (label, text)."""
    revisions, waits = summary["revisions_per_job"], summary["waits"]
    status = ", ".join(f"{count} {name}" for name, count in summary["status"].items())
    return [
        ("jobs", f"{summary['jobs']} ({status or 'none'})"),
        ("steps run", f"{summary['steps_run']} of {summary['steps']}"),
        ("makespan p50 / p95", seconds(summary["makespan_s"], "p50", "p95")),
        ("makespan / ideal (mean)", fmt(summary["makespan_ratio"]["mean"])),
        ("overhead p50 / p95", seconds(summary["overhead_s"], "p50", "p95")),
        ("revisions per job min / mean / max",
         f"{fmt(revisions['min'])} / {fmt(revisions['mean'], digits=2)} / "
         f"{fmt(revisions['max'])}"),
        ("revisions per step (mean)", fmt(summary["revisions_per_step"], digits=2)),
        ("lost claims", fmt(summary["lost_claims"])),
        ("retries", fmt(summary["retries"])),
        ("failures", fmt(summary["failures"])),
        ("steps saved by alt_do", fmt(summary["alt_do_steps"])),
        *([("skipped jobs (break the job rules)", str(len(summary["skipped"])))]
          if summary["skipped"] else []),
        ("waiting jobs: released / failed by a dependency / not released",
         f"{waits['jobs']}: {waits['released']} / {waits['failed_by_dependency']} / "
         f"{waits['not_released']}"),
        ("wait p50 / max", seconds(waits["wait_s"], "p50", "max")),
        ("delayed jobs, start lateness p50 / max",
         f"{waits['delayed']}: {seconds(waits['start_lateness_s'], 'p50', 'max')}"),
        *broadcast_headline(summary["broadcast"]),
        *tick_headline(summary["ticks"]),
        ("window", fmt(summary["window_s"], " s")),
    ]


def broadcast_headline(broadcast: dict) -> list[tuple[str, str]]:
    """The broadcast figures, when the run had broadcast steps."""
    if not broadcast["steps"]:
        return []
    return [("broadcast steps (sites each, mean)",
             f"{broadcast['steps']} ({fmt(broadcast['sites_per_step']['mean'], digits=2)})"),
            ("slowest site's lag p50 / max", seconds(broadcast["lag_s"], "p50", "max"))]


def tick_headline(ticks: dict) -> list[tuple[str, str]]:
    """The schedule figures, when the run had jobs that schedules made."""
    if not ticks["ticks"]:
        return []
    return [("scheduled jobs (schedules)", f"{ticks['ticks']} ({len(ticks['by_schedule'])})"),
            ("tick to job created p50 / max",
             seconds(ticks["creation_lateness_s"], "p50", "max")),
            ("tick to first start p50 / max", seconds(ticks["start_lateness_s"], "p50", "max"))]


def html_table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(fmt(cell))}</td>" for cell in row) + "</tr>"
        for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


PAGE_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
td, th { border: 1px solid #ccc; padding: .3em .7em; text-align: left; }
th { background: #f3f3f3; }
img { display: block; margin: 1em 0; max-width: 100%; }
.small { color: #666; font-size: .9em; }
"""


def skipped_section(skipped: list[dict[str, str]]) -> str:
    """The jobs left out for breaking the job rules, when there are any."""
    if not skipped:
        return ""
    rows = [[job["job_id"], job["reason"]] for job in skipped[:SKIPPED_SHOWN]]
    more = len(skipped) - len(rows)
    return ("<h2>Skipped jobs</h2>"
            f"<p>{len(skipped)} job documents break the job rules (`jobdist validate`): "
            "no table counts them. The first rule each breaks:</p>"
            + html_table(["job", "reason"], rows)
            + (f"<p class='small'>and {more} more</p>" if more else ""))


def skipped_line(skipped: list[dict[str, str]]) -> str | None:
    """One line for stderr: how many jobs were left out, and why (the first three)."""
    if not skipped:
        return None
    named = "; ".join(f"{job['job_id']}: {job['reason']}" for job in skipped[:3])
    more = f"; and {len(skipped) - 3} more" if len(skipped) > 3 else ""
    return (f"skipped {len(skipped)} job documents that break the job rules "
            f"({named}{more}); see report.html")


def render_page(summary: dict, charts: dict[str, str], source: str) -> str:
    """The self-contained HTML report: figures, charts (data URIs) and small tables."""
    site_rows = [[name, s["steps"], s["busy_s"], percent(s["utilisation"]), s["retries"],
                  s["failures"], s["overhead_p50_s"], s["overhead_p95_s"]]
                 for name, s in summary["sites"].items()]
    reasons = [[reason, count] for reason, count in summary["failure_reasons"].items()]
    images = "".join(f'<h3>{html.escape(title)}</h3><img alt="{html.escape(title)}" src="{uri}">'
                     for title, uri in charts.items())
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>jobdist report</title>"
        f"<style>{PAGE_STYLE}</style></head><body>"
        f"<h1>jobdist report</h1><p class='small'>{html.escape(source)}</p>"
        + html_table(["figure", "value"], [list(pair) for pair in headline(summary)])
        + "<h2>Sites</h2>"
        + html_table(["site", "steps", "busy s", "utilisation", "retries", "failures",
                      "overhead p50 s", "overhead p95 s"], site_rows)
        + f"<p class='small'>Utilisation assumes {summary['workers_per_site']} workers a site "
          "(documents do not say how many a site has).</p>"
        + "<h2>Failure reasons</h2>"
        + (html_table(["reason", "failures"], reasons) if reasons else "<p>None.</p>")
        + skipped_section(summary["skipped"])
        + f"<h2>Charts</h2>{images}"
        + "<p class='small'>Definitions: docs/analytics.md.</p></body></html>"
    )


# -- the pipeline ----------------------------------------------------------------------


def run_report(
    source: CouchSource,
    out: Path,
    master: str = "local[*]",
    workers: int = 2,
    *,
    on_stage: Stage | None = None,
) -> dict:
    """Read every job in `source`, write the tables and report.html under `out`; the
    summary. A CouchDB error reaching the database is a CouchError, any other failure a
    one-line ReportError.

    Uses the caller's active Spark session when there is one (and leaves it running);
    otherwise starts one on `master` and always stops it. `workers` is the worker count
    assumed for every site in utilisation: documents do not record it.
    """
    stage = on_stage or (lambda _: None)
    started = time.monotonic()
    database = source.open()
    database.info()  # a wrong name or login fails here, before Spark starts
    stage("listing job ids")  # before Spark: a database without the views fails at once
    ids = list_job_ids(database)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    active = SparkSession.getActiveSession()
    if active is None:
        stage(f"starting Spark on {master}")
    spark = active or start_spark(master, out / "spark.log")
    try:
        summary, charts = analyse(spark, source, ids, out, workers, stage)
    except (PySparkException, Py4JError) as error:
        raise spark_failure(error) from error
    finally:
        if active is None:
            spark.stop()
    stage("writing report.html")
    report = out / "report.html"
    read = f"{database.url} · {len(ids) - len(summary['skipped'])} jobs"
    report.write_text(render_page(summary, charts, read), encoding="utf-8")
    return summary | {"out": str(out), "report": str(report), "tables": list(TABLES),
                      "seconds": round(time.monotonic() - started, 3)}


def analyse(spark: SparkSession, source: CouchSource, ids: list[str], out: Path,
            workers: int, stage: Stage) -> tuple[dict, dict[str, str]]:
    """Write the tables under `out`; the summary and the charts."""
    stage(f"fetching {len(ids)} jobs")
    raw = load_jobs(spark, source, ids)
    tables: dict[str, DataFrame] = {}
    try:
        raw.count()  # fetch once, here, so that the stage shows where the time goes
        stage("computing tables")
        skipped = skipped_jobs(raw)
        tables, window_s = build_tables(raw.where("skipped IS NULL"), workers)
        summary = summarise(tables, workers, window_s) | {"skipped": skipped}
        stage(f"writing {len(tables)} tables")
        write_tables(tables, out)
        stage("drawing charts")
        return summary, draw_charts(tables, summary)
    finally:
        for df in (raw, *tables.values()):  # a caller's session outlives this report
            df.unpersist()
