"""`jobdist report`'s tables: derived from the raw job rows with Spark expressions
(docs/analytics.md defines every column), the summary figures, and writing them out."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobdist.model import Reason

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row

TABLES = ("jobs", "steps", "events", "sites", "failures", "waits", "broadcasts", "ticks")
CSV_TIME_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSX"  # the documents' own ISO 8601 UTC form


# -- the tables ------------------------------------------------------------------------


def seconds_between(start: Column | str, end: Column | str) -> Column:
    from pyspark.sql import functions as F

    return (F.unix_micros(F.col(end) if isinstance(end, str) else end)
            - F.unix_micros(F.col(start) if isinstance(start, str) else start)) / 1e6


def history_count(condition: Callable[[Column], Column]) -> Column:
    from pyspark.sql import functions as F

    return F.size(F.filter("history", condition))


def steps_table(raw: DataFrame) -> DataFrame:
    """One row per step; a step became runnable when the job did (step 0) or when the one
    before it finished."""
    from pyspark.sql import functions as F

    exploded = raw.select("job_id", job_runnable_at().alias("job_runnable_at"), "steps",
                          "history", F.posexplode("steps").alias("step", "s"))
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
        F.when(index == 0, F.col("job_runnable_at")).otherwise(previous).alias("runnable_at"),
        F.col("s.start_time").alias("start_time"),
        F.col("s.finish_time").alias("finish_time"),
        F.exists("history", lambda e: _event_at(index, e) & _gives(e, Reason.ALT_DO))
        .alias("alt_do_used"),
    ).withColumn("overhead_s", seconds_between("runnable_at", "start_time"))


def job_runnable_at() -> Column:
    """When the job's first step could start: its creation, or the end of a deliberate
    wait (its not-before time, its creator's release from waiting), whichever is last;
    the wait itself is no scheduling overhead."""
    from pyspark.sql import functions as F

    released = first_event(lambda e: e["event"] == "ready")
    return F.greatest("created_at", "not_before", released)


def step_ideal(step: Column) -> Column:
    """A step's part of the ideal: its `exec_time`, or a broadcast step's longest sub-run
    (its sites run it in parallel; dropped sites are not waited for); 0 if none ran."""
    from pyspark.sql import functions as F

    runs = F.filter(step["runs"], lambda r: ~r["dropped"])
    longest_run = F.array_max(F.transform(runs, lambda r: r["exec_time"]))
    return F.coalesce(step["exec_time"], longest_run, F.lit(0.0))


def _event_at(index: Column, event: Column, name: str | None = None) -> Column:
    """The history event is about step `index` (and is called `name`, when given)."""
    condition = event["step"] == index
    return condition if name is None else condition & (event["event"] == name)


def _gives(event: Column, reason: Reason) -> Column:
    """The event's reason code is `reason`; false, not null, when it has none (events
    written before events had codes have none: a report counts them as plain ones)."""
    from pyspark.sql import functions as F

    return F.coalesce(event["reason"] == reason.value, F.lit(False))


def jobs_table(raw: DataFrame) -> DataFrame:
    """One row per job: makespans, the ideal (its steps back to back, a broadcast step as
    its longest sub-run), revisions, claims."""
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
        F.round(F.aggregate("steps", F.lit(0.0), lambda total, s: total + step_ideal(s)), 6)
        .alias("ideal_s"),
        sum_steps("attempts", F.lit(0)).alias("attempts"),
        history_count(named("retried")).alias("retries"),
        history_count(named("failed")).alias("failures"),
        claims.alias("claims"),
        F.greatest(claims - wins, F.lit(0)).alias("lost_claims"),
        history_count(lambda e: _gives(e, Reason.ALT_DO)).alias("alt_do_steps"),
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

    by_dependency = first_event(lambda e: (e["event"] == "failed")
                                & _gives(e, Reason.WAITED_FOR))
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
                 & _gives(e, Reason.ALT_DO)).alias("alt_do_used"),
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
