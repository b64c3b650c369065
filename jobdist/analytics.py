"""`jobdist report`: job analytics on Spark, from a site's CouchDB to tables and one HTML page.

The driver lists job ids only; the executors fetch their share of the documents
over HTTP, so no single process ever holds every document. Each document
becomes one row with its steps and history as nested arrays; the tables are
derived from those rows with Spark expressions (docs/analytics.md defines every
column). pyspark and matplotlib are imported inside functions, so the rest of
the `jobdist` command works without them.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import html
import io
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jobdist.core import WAITED_FOR
from jobdist.couch import Couch, CouchError, Database, NotFound
from jobdist.model import Leaf, awaited, dropped_sites, is_broadcast, normalise, sub_runs

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row, SparkSession
    from pyspark.sql.types import StructType

EXIT_ERROR = 2
ID_PAGE = 200  # ids per `_all_docs` page on the driver: the SDK pager's largest
IDS_PER_PARTITION = 2000  # documents one task fetches and holds at a time
HISTOGRAM_BINS = 30
TABLES = ("jobs", "steps", "events", "sites", "failures", "waits", "broadcasts", "ticks")
ALT_DO_MARK = "alt_do succeeded"  # what a worker writes in the history when alt_do saved a step
OPTIONAL_MODULES = frozenset({"pyspark", "py4j", "matplotlib"})  # the `analytics` extra
CSV_TIME_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSX"  # the documents' own ISO 8601 UTC form

# Sized for a 2-core, 24 GB machine: in local mode the driver JVM is also the executor.
SPARK_CONF = {
    "spark.driver.memory": "4g",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # A short-lived JVM: C2's compiler threads cost more of 2 cores than they win back.
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
}
LOCAL_SPARK_CONF = {  # only for local masters: a cluster's executors must reach the driver
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.pyspark.python": os.environ.get("PYSPARK_PYTHON", sys.executable),
    # The Python workers import this very jobdist, not whichever one is installed.
    "spark.executorEnv.PYTHONPATH": os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parent.parent),
                      os.environ.get("PYTHONPATH")])),
}

Stage = Callable[[str], None]


class ReportError(Exception):
    """A failure a person can act on; the message is one line without credentials."""


# -- the driver: which documents exist ------------------------------------------------


def open_database(couch_url: str, db_name: str) -> Database:
    """The database, checked to exist: a wrong name fails here, before Spark starts."""
    database = Couch(couch_url).database(db_name)
    try:
        database.info()
    except NotFound:
        raise ReportError(
            f"database {db_name!r} does not exist at {database.couch.url}"
        ) from None
    except CouchError as error:
        raise ReportError(str(error)) from None
    return database


def list_job_ids(database: Database, page_size: int = ID_PAGE) -> list[str]:
    """Every job id, in pages of `_all_docs` without documents (the SDK's pager)."""
    return list(database.list_ids("job-", "job-\ufff0", page_size=page_size))


# -- the executors: fetch documents and shape them as rows ----------------------------


def fetch_partition(couch_url: str, db_name: str, ids: Iterable[str]) -> Iterator[tuple]:
    """The job rows for `ids`, fetched by whichever executor runs this partition."""
    database = Couch(couch_url).database(db_name)
    for doc in database.bulk_get(list(ids)):
        if doc.get("type") == "job":
            yield job_row(doc)


def job_row(doc: Leaf) -> tuple:
    """A job document as a tuple in `raw_schema()` order; a field it leaves out reads
    as its default (a job written over HTTP)."""
    doc = normalise(doc)
    return (
        doc["_id"],
        doc.get("creator"),
        _int(doc.get("priority")),
        doc.get("job_status"),
        _int(doc.get("step")),
        _moment(doc.get("created_at")),
        _moment(doc.get("updated_at")),
        _int(str(doc.get("_rev", "0")).split("-")[0]),
        [step_row(step) for step in doc.get("job") or []],
        [event_row(event) for event in doc.get("history") or []],
        len(awaited(doc)),  # waiting: how many jobs it names, and its time
        _moment(doc.get("not_before")),
        *_schedule_tick(doc.get("schedule")),
    )


def _schedule_tick(made_by: Any) -> tuple[str | None, datetime | None]:
    """(schedule name, tick) of a job a schedule made (its `schedule` field)."""
    if not isinstance(made_by, dict):
        return None, None
    name = made_by.get("name")
    return (name if isinstance(name, str) else None), _moment(made_by.get("tick"))


def step_row(step: Leaf) -> tuple:
    target = step.get("target")
    targets = [str(t) for t in target] if isinstance(target, list) else [str(target)]
    return (
        ",".join(targets),
        len(targets) == 1 and targets[0] != "any",
        _int(step.get("epoch")),
        step.get("winner"),
        step.get("executioner"),
        step.get("step_status"),
        _float(step.get("exec_time")),
        _moment(step.get("start_time")),
        _moment(step.get("finish_time")),
        _int(step.get("attempts")),
        _int(step.get("exit_code")),
        *_progress(step.get("progress")),
        is_broadcast(step),
        [sub_run_row(site, run, site in dropped_sites(step))
         for site, run in sorted(sub_runs(step).items())],
    )


def sub_run_row(site: str, run: Leaf, dropped: bool) -> tuple:
    """One site's part of a broadcast step."""
    return (site, run.get("status"), dropped, _int(run.get("attempts")),
            _int(run.get("exit_code")), _float(run.get("exec_time")),
            _moment(run.get("start_time")), _moment(run.get("finish_time")))


def _progress(report: Any) -> tuple[float | None, Any]:
    """The step's last progress report: (fraction, message), or nothing."""
    if not isinstance(report, dict):
        return None, None
    return _float(report.get("fraction")), report.get("message")


def event_row(event: Leaf) -> tuple:
    return (
        event.get("event"),
        _int(event.get("step")),
        event.get("site"),
        event.get("worker"),
        _int(event.get("epoch")),
        _moment(event.get("at")),
        event.get("detail"),
    )


def _moment(text: Any) -> datetime | None:
    # Lenient: one odd timestamp must not fail the whole report.
    try:
        return datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _int(value: Any) -> int | None:
    # JSON numbers may arrive as floats, and Spark will not take 3.0 as an integer.
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return int(value)
    except (ValueError, OverflowError):
        return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def raw_schema() -> StructType:
    from pyspark.sql.types import (
        ArrayType,
        BooleanType,
        DoubleType,
        IntegerType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    def struct(*fields: tuple[str, Any]) -> StructType:
        return StructType([StructField(name, kind(), True) for name, kind in fields])

    step = struct(
        ("target", StringType), ("targeted", BooleanType), ("epoch", IntegerType),
        ("winner", StringType), ("executioner", StringType), ("step_status", StringType),
        ("exec_time", DoubleType), ("start_time", TimestampType),
        ("finish_time", TimestampType), ("attempts", IntegerType), ("exit_code", IntegerType),
        ("progress", DoubleType), ("progress_message", StringType),
    )
    sub_run = struct(
        ("site", StringType), ("status", StringType), ("dropped", BooleanType),
        ("attempts", IntegerType), ("exit_code", IntegerType), ("exec_time", DoubleType),
        ("start_time", TimestampType), ("finish_time", TimestampType),
    )
    step.add("broadcast", BooleanType()).add("runs", ArrayType(sub_run, True))
    event = struct(
        ("event", StringType), ("step", IntegerType), ("site", StringType),
        ("worker", StringType), ("epoch", IntegerType), ("at", TimestampType),
        ("detail", StringType),
    )
    job = struct(
        ("job_id", StringType), ("creator", StringType), ("priority", IntegerType),
        ("job_status", StringType), ("current_step", IntegerType),
        ("created_at", TimestampType), ("updated_at", TimestampType),
        ("revisions", IntegerType),
    )
    job.add("steps", ArrayType(step, True)).add("history", ArrayType(event, True))
    job.add("after_count", IntegerType(), True).add("not_before", TimestampType(), True)
    job.add("schedule", StringType(), True).add("tick", TimestampType(), True)
    return job


def load_jobs(spark: SparkSession, couch_url: str, db_name: str, ids: list[str]) -> DataFrame:
    """One row per job, fetched by the executors and kept (memory, then disk) for reuse."""
    from pyspark import StorageLevel

    partitions = max(spark.sparkContext.defaultParallelism,
                     math.ceil(len(ids) / IDS_PER_PARTITION), 1)
    fetch = functools.partial(fetch_partition, couch_url, db_name)
    rows = spark.sparkContext.parallelize(ids, partitions).mapPartitions(fetch)
    raw = spark.createDataFrame(rows, raw_schema(), verifySchema=False)
    return raw.persist(StorageLevel.MEMORY_AND_DISK)


# -- the tables ------------------------------------------------------------------------


def seconds_between(start: Column | str, end: Column | str) -> Column:
    from pyspark.sql import functions as F

    return (F.unix_micros(F.col(end) if isinstance(end, str) else end)
            - F.unix_micros(F.col(start) if isinstance(start, str) else start)) / 1e6


def history_count(condition: Callable[[Column], Column]) -> Column:
    from pyspark.sql import functions as F

    return F.size(F.filter("history", condition))


def steps_table(raw: DataFrame) -> DataFrame:
    """One row per step; a step became runnable at creation (step 0) or when the one before
    it finished."""
    from pyspark.sql import functions as F

    exploded = raw.select("job_id", "created_at", "steps", "history",
                          F.posexplode("steps").alias("step", "s"))
    index = F.col("step")
    previous = F.col("steps")[F.greatest(index - 1, F.lit(0))]["finish_time"]
    return exploded.select(
        "job_id",
        "step",
        F.col("s.target").alias("target"),
        F.col("s.targeted").alias("targeted"),
        F.coalesce("s.winner", F.split("s.executioner", "/")[0]).alias("site"),
        F.col("s.executioner").alias("executioner"),
        F.col("s.step_status").alias("status"),
        F.col("s.epoch").alias("epoch"),
        F.col("s.attempts").alias("attempts"),
        history_count(lambda e: _event_at(index, e, "retried")).alias("retries"),
        F.col("s.exit_code").alias("exit_code"),
        F.col("s.exec_time").alias("exec_time_s"),
        F.col("s.progress").alias("progress"),  # the last value the command reported
        F.col("s.progress_message").alias("progress_message"),
        F.when(index == 0, F.col("created_at")).otherwise(previous).alias("runnable_at"),
        F.col("s.start_time").alias("start_time"),
        F.col("s.finish_time").alias("finish_time"),
        F.exists("history", lambda e: _event_at(index, e) & _mentions(e, ALT_DO_MARK))
        .alias("alt_do_used"),
    ).withColumn("overhead_s", seconds_between("runnable_at", "start_time"))


def _event_at(index: Column, event: Column, name: str | None = None) -> Column:
    """The history event is about step `index` (and is called `name`, when given)."""
    condition = event["step"] == index
    return condition if name is None else condition & (event["event"] == name)


def _mentions(event: Column, text: str) -> Column:
    """The event's detail contains `text`; false, not null, when there is no detail."""
    from pyspark.sql import functions as F

    return F.coalesce(event["detail"].contains(text), F.lit(False))


def jobs_table(raw: DataFrame) -> DataFrame:
    """One row per job: makespans, the ideal (its steps back to back), revisions, claims."""
    from pyspark.sql import functions as F

    def over_steps(field: str) -> Column:
        return F.transform("steps", lambda s: s[field])

    def sum_steps(field: str, zero: Column) -> Column:
        return F.aggregate("steps", zero, lambda total, s: total + F.coalesce(s[field], zero))

    def named(name: str) -> Callable[[Column], Column]:
        return lambda e: e["event"] == name

    ended = F.col("job_status").isNotNull()
    claims, wins = history_count(named("claimed")), history_count(named("won"))
    jobs = raw.select(
        "job_id", "creator", "priority",
        F.coalesce("job_status", F.lit("live")).alias("status"),
        F.size("steps").alias("steps"),
        F.size(F.filter("steps", lambda s: s["step_status"].isin("finished", "failed")))
        .alias("steps_run"),
        F.size(F.filter("steps", lambda s: s["targeted"])).alias("targeted_steps"),
        "created_at",
        F.array_min(over_steps("start_time")).alias("first_start"),
        F.when(ended, F.array_max(over_steps("finish_time"))).alias("last_finish"),
        F.round(sum_steps("exec_time", F.lit(0.0)), 6).alias("ideal_s"),
        sum_steps("attempts", F.lit(0)).alias("attempts"),
        history_count(named("retried")).alias("retries"),
        history_count(named("failed")).alias("failures"),
        claims.alias("claims"),
        F.greatest(claims - wins, F.lit(0)).alias("lost_claims"),
        history_count(lambda e: _mentions(e, ALT_DO_MARK)).alias("alt_do_steps"),
        "revisions",
    )
    return jobs.select(
        "*",
        seconds_between("first_start", "last_finish").alias("makespan_s"),
        seconds_between("created_at", "last_finish").alias("turnaround_s"),
    ).select(
        "*",
        F.try_divide("makespan_s", "ideal_s").alias("makespan_ratio"),
        F.round(F.col("turnaround_s") - F.col("ideal_s"), 6).alias("waiting_s"),
        F.try_divide("revisions", "steps").alias("revisions_per_step"),
    )


def events_table(raw: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return raw.select("job_id", F.explode("history").alias("e")).select(
        "job_id", "e.event", "e.step", "e.site", "e.worker", "e.epoch", "e.at", "e.detail")


def failures_table(events: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return events.where(F.col("event") == "failed").select(
        "job_id", "step", "site", "worker", "epoch", "at", F.col("detail").alias("reason"))


def first_event(condition: Callable[[Column], Column]) -> Column:
    """The time of the job's first history event that meets `condition` (null: none)."""
    from pyspark.sql import functions as F

    return F.array_min(F.transform(F.filter("history", condition), lambda e: e["at"]))


def waits_table(raw: DataFrame) -> DataFrame:
    """One row per job that waits or waited (for other jobs, or for a time): when its
    creator released it (`ready`) or failed it for a job it waited for, how long that
    took from its creation, and how late its first start came after `not_before`."""
    from pyspark.sql import functions as F

    by_dependency = first_event(lambda e: (e["event"] == "failed") & F.coalesce(
        e["detail"].startswith(WAITED_FOR), F.lit(False)))
    waits = raw.where((F.col("after_count") > 0) | F.col("not_before").isNotNull()).select(
        "job_id", "creator", F.coalesce("job_status", F.lit("live")).alias("status"),
        "after_count", "not_before", "created_at",
        first_event(lambda e: e["event"] == "ready").alias("released_at"),
        by_dependency.alias("dependency_failed_at"),
        first_event(lambda e: e["event"] == "started").alias("first_start"),
    )
    return waits.select(
        "*",
        F.col("dependency_failed_at").isNotNull().alias("failed_by_dependency"),
        seconds_between("created_at", F.coalesce("released_at", "dependency_failed_at"))
        .alias("wait_s"),
        seconds_between("not_before", "first_start").alias("start_lateness_s"),
    )


def wait_figures(waits: DataFrame) -> dict:
    """The waiting jobs in the summary: how many, how their wait ended, how long it was,
    and how late delayed jobs started."""
    from pyspark.sql import functions as F

    totals = only_row(waits.agg(
        F.count("*").alias("jobs"),
        F.count("released_at").alias("released"),
        F.sum(F.col("failed_by_dependency").cast("int")).alias("failed_by_dependency"),
        F.count("not_before").alias("delayed"),
    ))
    still = totals["jobs"] - totals["released"] - (totals["failed_by_dependency"] or 0)
    figures = spreads(waits, "wait_s", "start_lateness_s")
    return {"jobs": totals["jobs"], "released": totals["released"],
            "failed_by_dependency": totals["failed_by_dependency"] or 0,
            "not_released": still, "delayed": totals["delayed"],
            "wait_s": figures["wait_s"], "start_lateness_s": figures["start_lateness_s"]}


def ticks_table(raw: DataFrame) -> DataFrame:
    """One row per job a schedule made: how late its owner created the tick's job
    (`creation_lateness_s`, the owner's pass, or a catch-up after it was down) and how
    late its first step started after the tick (`start_lateness_s`)."""
    from pyspark.sql import functions as F

    ticks = raw.where(F.col("tick").isNotNull()).select(
        "job_id", "schedule", "tick", "creator",
        F.coalesce("job_status", F.lit("live")).alias("status"), "created_at",
        first_event(lambda e: e["event"] == "started").alias("first_start"))
    return ticks.select(
        "*",
        seconds_between("tick", "created_at").alias("creation_lateness_s"),
        seconds_between("tick", "first_start").alias("start_lateness_s"),
    )


def tick_figures(ticks: DataFrame) -> dict:
    """Schedule lateness in the summary: ticks by schedule, and how late they ran."""
    figures = spreads(ticks, "creation_lateness_s", "start_lateness_s")
    return {"ticks": ticks.count(), "by_schedule": counts(ticks, "schedule"), **figures}


def broadcasts_table(raw: DataFrame) -> DataFrame:
    """One row per broadcast step its creator opened: its fan-out (sites, how each
    ended), and how long the step waited for its slowest site after the fastest one
    finished (`lag_s`): what one slow site costs every broadcast."""
    from pyspark.sql import functions as F

    steps = raw.select("job_id", F.posexplode("steps").alias("step", "s")) \
        .where(F.col("s.broadcast") & (F.size("s.runs") > 0))
    counting = F.filter("s.runs", lambda r: ~r["dropped"])
    ended = F.filter(counting, lambda r: r["finish_time"].isNotNull())
    slowest = F.array_max(F.transform(ended, lambda r: F.struct(r["finish_time"], r["site"])))

    def how_many(status: str) -> Column:
        return F.size(F.filter(counting, lambda r: r["status"] == status))

    return steps.select(
        "job_id", "step",
        F.col("s.step_status").alias("status"),
        F.size(counting).alias("sites"),
        how_many("finished").alias("finished"),
        how_many("failed").alias("failed"),
        (F.size("s.runs") - F.size(counting)).alias("dropped"),
        F.col("s.start_time").alias("opened_at"),
        F.array_min(F.transform(ended, lambda r: r["finish_time"])).alias("first_finish"),
        slowest["finish_time"].alias("last_finish"),
        slowest["site"].alias("slowest_site"),
    ).select(
        "*",
        seconds_between("first_finish", "last_finish").alias("lag_s"),
        seconds_between("opened_at", "last_finish").alias("span_s"),
    )


def broadcast_summary(broadcasts: DataFrame) -> dict:
    """Broadcast fan-out: how many steps, how many sites each, the slowest site's lag."""
    figures = spreads(broadcasts, "sites", "lag_s", "span_s")
    return {"steps": broadcasts.count(), "sites_per_step": figures["sites"],
            "lag_s": figures["lag_s"], "span_s": figures["span_s"],
            "slowest_sites": counts(broadcasts.where("slowest_site IS NOT NULL"),
                                    "slowest_site", limit=10)}


def run_window(steps: DataFrame) -> tuple[datetime | None, datetime | None, float | None]:
    """First start and last finish over every step that ran, and the seconds between."""
    from pyspark.sql import functions as F

    row = only_row(steps.agg(
        F.min("start_time").alias("start"), F.max("finish_time").alias("end"),
        seconds_between(F.min("start_time"), F.max("finish_time")).alias("seconds"),
    ))
    return row["start"], row["end"], row["seconds"]


def parts_table(raw: DataFrame) -> DataFrame:
    """Each site's ended part of a broadcast step, as the sites table counts a step run:
    runnable when the creator opened the step (dropped sites' parts left out)."""
    from pyspark.sql import functions as F

    parts = raw.select("history", F.posexplode("steps").alias("step", "s")) \
        .where(F.col("s.broadcast")) \
        .select("history", "step", F.col("s.start_time").alias("runnable_at"),
                F.explode("s.runs").alias("r")) \
        .where(~F.col("r.dropped") & F.col("r.status").isin("finished", "failed"))
    site = F.col("r.site")
    return parts.select(
        site.alias("site"),
        F.col("r.exec_time").alias("exec_time_s"),
        F.exists("history", lambda e: _event_at(F.col("step"), e) & (e["site"] == site)
                 & _mentions(e, ALT_DO_MARK)).alias("alt_do_used"),
        seconds_between("runnable_at", "r.start_time").alias("overhead_s"),
    )


def sites_table(steps: DataFrame, parts: DataFrame, events: DataFrame, workers: int,
                window_s: float | None) -> DataFrame:
    """One row per site that ran steps (or parts of broadcast steps): busy time against
    `workers` slots over the window."""
    from pyspark.sql import functions as F

    ran = steps.where(F.col("status").isin("finished", "failed") & F.col("site").isNotNull()) \
        .select("site", "exec_time_s", "alt_do_used", "overhead_s").unionByName(parts)
    work = ran.groupBy("site").agg(
        F.count("*").alias("steps"),
        F.round(F.coalesce(F.sum("exec_time_s"), F.lit(0.0)), 6).alias("busy_s"),
        F.sum(F.col("alt_do_used").cast("int")).alias("alt_do_steps"),
        F.percentile("overhead_s", 0.5).alias("overhead_p50_s"),
        F.percentile("overhead_s", 0.95).alias("overhead_p95_s"),
    )
    # An execution's events (they name its worker): not the creator ending a step or a job.
    trouble = events.where(F.col("event").isin("retried", "failed")
                           & F.col("worker").isNotNull()).groupBy("site").agg(
        F.sum((F.col("event") == "retried").cast("int")).alias("retries"),
        F.sum((F.col("event") == "failed").cast("int")).alias("failures"),
    )
    capacity = F.lit(workers) * F.lit(window_s).cast("double")
    return (
        work.join(trouble, "site", "left")
        .fillna(0, ["retries", "failures"])
        .select(
            "site", "steps", "busy_s",
            F.lit(window_s).cast("double").alias("window_s"),
            F.lit(workers).alias("workers"),
            F.try_divide("busy_s", capacity).alias("utilisation"),
            "retries", "failures", "alt_do_steps", "overhead_p50_s", "overhead_p95_s",
        )
        .orderBy("site")
    )


def build_tables(raw: DataFrame, workers: int) -> tuple[dict[str, DataFrame], float | None]:
    """The tables by name, and the run's wall-clock window in seconds."""
    steps = steps_table(raw).cache()
    events = events_table(raw).cache()  # read by four outputs: explode it once
    _, _, window_s = run_window(steps)
    tables = {
        "jobs": jobs_table(raw).cache(),
        "steps": steps,
        "events": events,
        "sites": sites_table(steps, parts_table(raw), events, workers, window_s).cache(),
        "failures": failures_table(events),
        "waits": waits_table(raw).cache(),
        "broadcasts": broadcasts_table(raw).cache(),
        "ticks": ticks_table(raw).cache(),
    }
    return tables, window_s


# -- summary figures --------------------------------------------------------------------


def spreads(df: DataFrame, *columns: str) -> dict[str, dict[str, float | None]]:
    """min, p50, p95, p99, max and mean of each column (exact percentiles, nulls ignored),
    all in one Spark job."""
    from pyspark.sql import functions as F

    stats = []
    for column in columns:
        stats += [F.min(column).alias(f"{column}.min"),
                  F.percentile(column, [0.5, 0.95, 0.99]).alias(f"{column}.p"),
                  F.max(column).alias(f"{column}.max"), F.avg(column).alias(f"{column}.mean")]
    row = only_row(df.agg(*stats))
    found = {}
    for column in columns:
        p50, p95, p99 = row[f"{column}.p"] or (None, None, None)
        found[column] = {"min": row[f"{column}.min"], "p50": p50, "p95": p95, "p99": p99,
                         "max": row[f"{column}.max"], "mean": row[f"{column}.mean"]}
    return found


def only_row(frame: DataFrame) -> Row:
    """The row of an aggregation without grouping: there is always exactly one."""
    row = frame.first()
    assert row is not None
    return row


def counts(df: DataFrame, column: str, limit: int | None = None) -> dict[Any, int]:
    """How often each value of `column` occurs, most frequent first."""
    from pyspark.sql import functions as F

    grouped = df.groupBy(column).count().orderBy(F.desc("count"), column)
    rows = grouped.limit(limit).collect() if limit else grouped.collect()
    return {row[column]: row["count"] for row in rows}


def summarise(tables: dict[str, DataFrame], workers: int, window_s: float | None) -> dict:
    from pyspark.sql import functions as F

    jobs, steps = tables["jobs"], tables["steps"]
    totals = only_row(jobs.agg(
        F.count("*").alias("jobs"), F.sum("steps").alias("steps"),
        F.sum("steps_run").alias("steps_run"), F.sum("retries").alias("retries"),
        F.sum("lost_claims").alias("lost_claims"), F.sum("alt_do_steps").alias("alt_do_steps"),
        F.avg("revisions_per_step").alias("revisions_per_step"),
        F.sum("failures").alias("failures"),
    ))
    sites = {row["site"]: row.asDict() for row in tables["sites"].collect()}
    per_job = spreads(jobs, "makespan_s", "turnaround_s", "ideal_s", "makespan_ratio",
                      "revisions")
    reasons = counts(tables["failures"], "reason", limit=10)
    return {
        "jobs": totals["jobs"],
        "steps": totals["steps"] or 0,
        "steps_run": totals["steps_run"] or 0,
        "status": counts(jobs, "status"),
        **{name: per_job[name] for name in ("makespan_s", "turnaround_s", "ideal_s",
                                            "makespan_ratio")},
        "overhead_s": spreads(steps, "overhead_s")["overhead_s"],
        "revisions_per_job": per_job["revisions"],
        "revisions_per_step": totals["revisions_per_step"],
        "lost_claims": totals["lost_claims"] or 0,
        "retries": totals["retries"] or 0,
        "failures": totals["failures"] or 0,
        "failure_reasons": reasons,
        "alt_do_steps": totals["alt_do_steps"] or 0,
        "window_s": window_s,
        "workers_per_site": workers,
        "sites": sites,
        "waits": wait_figures(tables["waits"]),
        "broadcast": broadcast_summary(tables["broadcasts"]),
        "ticks": tick_figures(tables["ticks"]),
    }


# -- writing the tables ----------------------------------------------------------------


def write_tables(tables: dict[str, DataFrame], out: Path) -> None:
    """Each table as NAME.parquet (a directory, Spark's layout) and NAME.csv (one file)."""
    for name, df in tables.items():
        df.write.mode("overwrite").parquet(str(out / f"{name}.parquet"))
        write_single_csv(df, out / f"{name}.csv")


def write_single_csv(df: DataFrame, path: Path) -> None:
    """Spark writes a directory of parts; one partition gives one part, moved to `path`."""
    staging = path.with_name(f".{path.name}.parts")
    (df.coalesce(1).write.mode("overwrite")
     .option("header", True).option("timestampFormat", CSV_TIME_FORMAT)
     .csv(str(staging)))
    part = next(staging.glob("part-*.csv"))
    path.unlink(missing_ok=True)
    part.replace(path)
    shutil.rmtree(staging)


# -- charts and the HTML page ----------------------------------------------------------


def histogram(df: DataFrame, column: str, low: float | None, high: float | None,
              bins: int = HISTOGRAM_BINS) -> tuple[list[float], list[int]]:
    """Bin edges and counts, binned by Spark; values past `high` land in the last bin."""
    from pyspark.sql import functions as F

    if low is None or high is None:
        return [], []
    width = (high - low) / bins if high > low else 1.0
    bin_of = F.least(F.greatest(F.floor((F.col(column) - low) / width), F.lit(0)), F.lit(bins - 1))
    found = {row["bin"]: row["count"] for row in
             df.where(F.col(column).isNotNull()).groupBy(bin_of.alias("bin")).count().collect()}
    return [low + i * width for i in range(bins + 1)], [found.get(i, 0) for i in range(bins)]


def png_data_uri(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def whole_numbers(axes: Any) -> None:
    """Counts get integer ticks: no "0.5 jobs" on a small run."""
    from matplotlib.ticker import MaxNLocator

    axes.yaxis.set_major_locator(MaxNLocator(integer=True))


def histogram_chart(edges: list[float], bin_counts: list[int], title: str, xlabel: str,
                    marks: dict[str, float | None]) -> str:
    # Figure without pyplot: no global state and no GUI backend (the Agg canvas draws it).
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 3.2))
    axes = figure.subplots()
    if bin_counts:
        axes.stairs(bin_counts, edges, fill=True, alpha=0.6)
    for (label, value), colour in zip(marks.items(), ("tab:orange", "tab:red"), strict=False):
        if value is not None:
            axes.axvline(value, color=colour, linestyle="--", label=f"{label} {value:.3f} s")
    if any(value is not None for value in marks.values()):
        axes.legend()
    axes.set(title=title, xlabel=xlabel, ylabel="count")
    whole_numbers(axes)
    return png_data_uri(figure)


def bar_chart(labels: list[str], values: list[float], title: str, ylabel: str,
              percent: bool = False) -> str:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 3.2))
    axes = figure.subplots()
    bars = axes.bar(labels, values, color="tab:blue")
    axes.bar_label(bars, labels=[f"{v:.0%}" if percent else f"{v:g}" for v in values])
    axes.set(title=title, ylabel=ylabel)
    axes.set_ylim(0, max([1.0 if percent else 0.0, *values]) * 1.15 or 1.0)  # room for labels
    if not percent:
        whole_numbers(axes)
    return png_data_uri(figure)


def draw_charts(tables: dict[str, DataFrame], summary: dict) -> dict[str, str]:
    """The report's charts as PNG data URIs, by title."""
    makespan, overhead = summary["makespan_s"], summary["overhead_s"]
    sites = summary["sites"]
    revisions = dict(sorted(counts(tables["jobs"], "revisions").items()))
    # The overhead axis stops at p99: one stuck step must not squeeze the rest into one bar.
    overhead_high = overhead["p99"]
    return {
        "Makespan per job": histogram_chart(
            *histogram(tables["jobs"], "makespan_s", makespan["min"], makespan["max"]),
            "Makespan per job (first start to last finish)", "seconds",
            {"p50": makespan["p50"], "p95": makespan["p95"]}),
        "Scheduling overhead per step": histogram_chart(
            *histogram(tables["steps"], "overhead_s", min(overhead["min"] or 0.0, 0.0),
                       overhead_high),
            "Scheduling overhead per step (runnable to start; steps past p99 in the last bar)",
            "seconds", {"p50": overhead["p50"], "p95": overhead["p95"]}),
        "Utilisation per site": bar_chart(
            list(sites), [s["utilisation"] or 0.0 for s in sites.values()],
            f"Utilisation per site ({summary['workers_per_site']} workers a site)",
            "busy / (workers x window)", percent=True),
        "Revisions per job": bar_chart(
            [str(r) for r in revisions], list(revisions.values()),
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


def headline(summary: dict) -> list[tuple[str, str]]:
    """The figures at the top of the report, as (label, text)."""
    makespan, overhead = summary["makespan_s"], summary["overhead_s"]
    revisions = summary["revisions_per_job"]
    status = ", ".join(f"{count} {name}" for name, count in summary["status"].items())
    return [
        ("jobs", f"{summary['jobs']} ({status or 'none'})"),
        ("steps run", f"{summary['steps_run']} of {summary['steps']}"),
        ("makespan p50 / p95", f"{fmt(makespan['p50'], ' s')} / {fmt(makespan['p95'], ' s')}"),
        ("makespan / ideal (mean)", fmt(summary["makespan_ratio"]["mean"])),
        ("overhead p50 / p95", f"{fmt(overhead['p50'], ' s')} / {fmt(overhead['p95'], ' s')}"),
        ("revisions per job min / mean / max",
         f"{fmt(revisions['min'])} / {fmt(revisions['mean'], digits=2)} / "
         f"{fmt(revisions['max'])}"),
        ("revisions per step (mean)", fmt(summary["revisions_per_step"], digits=2)),
        ("lost claims", fmt(summary["lost_claims"])),
        ("retries", fmt(summary["retries"])),
        ("failures", fmt(summary["failures"])),
        ("steps saved by alt_do", fmt(summary["alt_do_steps"])),
        *wait_headline(summary["waits"]),
        *broadcast_headline(summary["broadcast"]),
        *tick_headline(summary["ticks"]),
        ("window", fmt(summary["window_s"], " s")),
    ]


def wait_headline(waits: dict) -> list[tuple[str, str]]:
    wait, late = waits["wait_s"], waits["start_lateness_s"]
    return [
        ("waiting jobs: released / failed by a dependency / not released",
         f"{waits['jobs']}: {waits['released']} / {waits['failed_by_dependency']} / "
         f"{waits['not_released']}"),
        ("wait p50 / max", f"{fmt(wait['p50'], ' s')} / {fmt(wait['max'], ' s')}"),
        ("delayed jobs, start lateness p50 / max",
         f"{waits['delayed']}: {fmt(late['p50'], ' s')} / {fmt(late['max'], ' s')}"),
    ]


def broadcast_headline(broadcast: dict) -> list[tuple[str, str]]:
    """The broadcast figures, when the run had broadcast steps."""
    if not broadcast["steps"]:
        return []
    lag = broadcast["lag_s"]
    return [("broadcast steps (sites each, mean)",
             f"{broadcast['steps']} ({fmt(broadcast['sites_per_step']['mean'], digits=2)})"),
            ("slowest site's lag p50 / max", f"{fmt(lag['p50'], ' s')} / {fmt(lag['max'], ' s')}")]


def tick_headline(ticks: dict) -> list[tuple[str, str]]:
    """The schedule figures, when the run had jobs that schedules made."""
    if not ticks["ticks"]:
        return []
    made, started = ticks["creation_lateness_s"], ticks["start_lateness_s"]
    return [("scheduled jobs (schedules)", f"{ticks['ticks']} ({len(ticks['by_schedule'])})"),
            ("tick to job created p50 / max", f"{fmt(made['p50'], ' s')} / "
                                              f"{fmt(made['max'], ' s')}"),
            ("tick to first start p50 / max", f"{fmt(started['p50'], ' s')} / "
                                              f"{fmt(started['max'], ' s')}")]


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
        + f"<h2>Charts</h2>{images}"
        + "<p class='small'>Definitions: docs/analytics.md.</p></body></html>"
    )


# -- Spark session ---------------------------------------------------------------------


def require_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and Path(java_home, "bin", "java").exists():
        return
    if not java_home and shutil.which("java"):
        return
    raise ReportError("Java not found: Spark needs Java 17 or 21 "
                      "(install a JDK or set JAVA_HOME)")


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """Point file descriptor 2 at `path` meanwhile: a JVM started now writes its log there
    for good (so do the Python workers it forks), while ours comes back afterwards."""
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def start_spark(master: str = "local[*]", log_path: Path | None = None) -> SparkSession:
    """A quiet Spark session: its console output goes to `log_path` (or nowhere)."""
    require_java()
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName("jobdist-report")
    local = master.startswith("local")
    for key, value in {**SPARK_CONF, **(LOCAL_SPARK_CONF if local else {})}.items():
        builder = builder.config(key, value)
    try:
        with stderr_to(log_path or Path(os.devnull)):
            session = builder.getOrCreate()
    except (PySparkException, OSError) as error:
        where = f"; see {log_path}" if log_path else ""
        raise ReportError(f"Spark did not start on {master}: {_first_line(error)}{where}") from None
    session.sparkContext.setLogLevel("ERROR")
    return session


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0][:300] if lines else type(error).__name__


def spark_failure(error: BaseException) -> ReportError:
    """One line from a failed Spark job: the CouchDB error an executor met, when it was one."""
    text = str(error)
    found = re.findall(r"jobdist\.couch\.\w+: (.+)", text)
    return ReportError(found[-1].strip() if found else f"Spark job failed: {_first_line(error)}")


# -- the pipeline ----------------------------------------------------------------------


def run_report(
    couch_url: str,
    db: str,
    out: Path,
    master: str = "local[*]",
    workers: int = 2,
    *,
    on_stage: Stage | None = None,
) -> dict:
    """Read every job in `db`, write the tables and report.html under `out`; the summary.

    Uses the caller's active Spark session when there is one (and leaves it running);
    otherwise starts one on `master` and always stops it. `workers` is the worker count
    assumed for every site in utilisation: documents do not record it.
    """
    from pyspark.sql import SparkSession

    stage = on_stage or (lambda _: None)
    started = time.monotonic()
    database = open_database(couch_url, db)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    active = SparkSession.getActiveSession()
    if active is None:
        stage(f"starting Spark on {master}")
    spark = active or start_spark(master, out / "spark.log")
    try:
        summary = _pipeline(spark, couch_url, database, out, workers, stage)
    finally:
        if active is None:
            spark.stop()
    summary["seconds"] = round(time.monotonic() - started, 3)
    return summary


def _pipeline(spark: SparkSession, couch_url: str, database: Database, out: Path,
              workers: int, stage: Stage) -> dict:
    from py4j.protocol import Py4JError  # type: ignore[import-untyped]
    from pyspark.errors import PySparkException

    stage("listing job ids")
    try:
        ids = list_job_ids(database)
    except CouchError as error:
        raise ReportError(str(error)) from None
    try:
        return _analyse(spark, couch_url, database, ids, out, workers, stage)
    except (PySparkException, Py4JError) as error:
        raise spark_failure(error) from error


def _analyse(spark: SparkSession, couch_url: str, database: Database, ids: list[str],
             out: Path, workers: int, stage: Stage) -> dict:
    stage(f"fetching {len(ids)} jobs")
    raw = load_jobs(spark, couch_url, database.name, ids)
    tables: dict[str, DataFrame] = {}
    try:
        raw.count()  # fetch once, here, so that the stage shows where the time goes
        stage("computing tables")
        tables, window_s = build_tables(raw, workers)
        summary = summarise(tables, workers, window_s)
        stage(f"writing {len(tables)} tables")
        write_tables(tables, out)
        stage("drawing charts")
        charts = draw_charts(tables, summary)
    finally:
        for df in (raw, *tables.values()):  # a caller's session outlives this report
            df.unpersist()
    stage("writing report.html")
    report = out / "report.html"
    report.write_text(render_page(summary, charts, f"{database.url} · {len(ids)} jobs"),
                      encoding="utf-8")
    return summary | {"out": str(out), "report": str(report), "tables": list(TABLES)}


# -- the command -----------------------------------------------------------------------


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


def print_summary(console: Console, summary: dict) -> None:
    table = Table(show_header=False, box=None)
    for label, value in headline(summary):
        table.add_row(label, value)
    console.print(table)
    console.print(f"report: {summary['report']} ({summary['seconds']:.1f} s)")


@click.option("--couch", "couch_url", required=True, metavar="URL",
              help="The site's CouchDB, e.g. http://127.0.0.1:5984 (credentials may be in it).")
@click.option("--db", "db_name", required=True, metavar="NAME", help="The jobs database.")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the tables (Parquet and CSV) and report.html.")
@click.option("--master", default="local[*]", show_default=True, help="Spark master.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1),
              help="Workers per site, for utilisation (documents do not record it).")
def _report(couch_url: str, db_name: str, out: Path, master: str, workers: int) -> None:
    """Analyse every job in a site's database with Spark: tables and an HTML report."""
    console = Console()  # stdout: stderr is the JVM's log while Spark starts
    try:
        with console.status("starting …") as status:
            display = StageDisplay(status, console)
            summary = run_report(couch_url, db_name, out, master, workers, on_stage=display)
            display.done()
    except ModuleNotFoundError as error:
        if error.name not in OPTIONAL_MODULES:
            raise
        _fail(f"{error.name} is not installed: pip install 'jobdist[analytics]'")
    except (ReportError, CouchError, OSError) as error:
        _fail(" ".join(str(error).split()))
    print_summary(console, summary)


def _fail(message: str) -> NoReturn:
    click.echo(f"jobdist report: {message}", err=True)
    sys.exit(EXIT_ERROR)


report = click.command("report")(_report)
