"""`jobdist report`'s tables: derived from the raw job rows with Spark expressions
(docs/analytics.md defines every column), the summary figures, and writing them out."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from jobdist.model import Reason

TABLES = ("jobs", "steps", "events", "sites", "failures", "waits", "broadcasts", "ticks")
CSV_TIME_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSX"  # the documents' own ISO 8601 UTC form
RAN = ("finished", "failed")  # a step, or a site's part of a broadcast step, that ran
SUMMED = ("steps", "steps_run", "retries", "failures", "lost_claims", "alt_do_steps")


# -- column expressions -----------------------------------------------------------------


def seconds_between(start: Column | str, end: Column | str) -> Column:
    return (F.unix_micros(end) - F.unix_micros(start)) / 1e6


def named(name: str) -> Callable[[Column], Column]:
    """A condition on a history event: it is called `name`."""
    return lambda event: event["event"] == name


def gives(event: Column, reason: Reason) -> Column:
    """The event's reason code is `reason`; false, not null, when it has none (events
    written before events had codes have none: a report counts them as plain ones)."""
    return event["reason"].eqNullSafe(reason.value)


def history_count(condition: Callable[[Column], Column]) -> Column:
    return F.size(F.filter("history", condition))


def first_event(condition: Callable[[Column], Column]) -> Column:
    """The time of the job's first history event that meets `condition` (null: none)."""
    return F.array_min(F.filter("history", condition)["at"])


def job_status() -> Column:
    return F.coalesce("job_status", F.lit("live")).alias("status")


def job_runnable_at() -> Column:
    """When the job's first step could start: its creation, or the end of a deliberate
    wait (its not-before time, its creator's release from waiting), whichever is last;
    the wait itself is no scheduling overhead."""
    return F.greatest("created_at", "not_before", first_event(named("ready")))


def step_ideal(step: Column) -> Column:
    """A step's part of the ideal: its `exec_time`, or a broadcast step's longest sub-run
    (its sites run it in parallel; dropped sites are not waited for); 0 if none ran."""
    runs = F.filter(step["runs"], lambda r: ~r["dropped"])
    return F.coalesce(step["exec_time"], F.array_max(runs["exec_time"]), F.lit(0.0))


# -- the tables ------------------------------------------------------------------------


def jobs_table(raw: DataFrame) -> DataFrame:
    """One row per job: makespans, the ideal (its steps back to back, a broadcast step as
    its longest sub-run), revisions, claims."""
    claims = history_count(named("claimed"))
    jobs = raw.select(
        "job_id", "creator", "priority", job_status(),
        F.size("steps").alias("steps"),
        F.size(F.filter("steps", lambda s: s["step_status"].isin(*RAN))).alias("steps_run"),
        F.size(F.filter("steps", lambda s: s["targeted"])).alias("targeted_steps"),
        "created_at",
        F.array_min("steps.start_time").alias("first_start"),
        F.when(F.col("job_status").isNotNull(), F.array_max("steps.finish_time"))
        .alias("last_finish"),
        F.round(F.aggregate("steps", F.lit(0.0), lambda total, s: total + step_ideal(s)), 6)
        .alias("ideal_s"),
        F.aggregate("steps.attempts", F.lit(0), lambda total, n: total + F.coalesce(n, F.lit(0)))
        .alias("attempts"),
        history_count(named("retried")).alias("retries"),
        history_count(named("failed")).alias("failures"),
        claims.alias("claims"),
        F.greatest(claims - history_count(named("won")), F.lit(0)).alias("lost_claims"),
        history_count(lambda e: gives(e, Reason.ALT_DO)).alias("alt_do_steps"),
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


def steps_table(raw: DataFrame) -> DataFrame:
    """One row per step; a step became runnable when the job did (step 0) or when the one
    before it finished."""
    index = F.col("step")
    previous = F.col("steps")[F.greatest(index - 1, F.lit(0))]["finish_time"]
    return raw.select("*", F.posexplode("steps").alias("step", "s")).select(
        "job_id", "step", "s.target", "s.targeted",
        F.coalesce("s.winner", F.split("s.executioner", "/")[0]).alias("site"),
        "s.executioner", F.col("s.step_status").alias("status"), "s.epoch", "s.attempts",
        history_count(lambda e: (e["step"] == index) & (e["event"] == "retried"))
        .alias("retries"),
        "s.exit_code", F.col("s.exec_time").alias("exec_time_s"),
        "s.progress", "s.progress_message",  # the last progress the command reported
        F.when(index == 0, job_runnable_at()).otherwise(previous).alias("runnable_at"),
        "s.start_time", "s.finish_time",
        F.exists("history", lambda e: (e["step"] == index) & gives(e, Reason.ALT_DO))
        .alias("alt_do_used"),
    ).withColumn("overhead_s", seconds_between("runnable_at", "start_time"))


def events_table(raw: DataFrame) -> DataFrame:
    return raw.select("job_id", F.explode("history").alias("e")).select(
        "job_id", "e.event", "e.step", "e.site", "e.worker", "e.epoch", "e.at", "e.detail")


def failures_table(events: DataFrame) -> DataFrame:
    return events.where(F.col("event") == "failed").select(
        "job_id", "step", "site", "worker", "epoch", "at", F.col("detail").alias("reason"))


def waits_table(raw: DataFrame) -> DataFrame:
    """One row per job that waits or waited, for other jobs or for a time: how its wait
    ended, how long it took, and how late a delayed job started."""
    failed_by = first_event(lambda e: (e["event"] == "failed") & gives(e, Reason.WAITED_FOR))
    waits = raw.where((F.col("after_count") > 0) | F.col("not_before").isNotNull()).select(
        "job_id", "creator", job_status(), "after_count", "not_before", "created_at",
        first_event(named("ready")).alias("released_at"),
        failed_by.alias("dependency_failed_at"),
        first_event(named("started")).alias("first_start"),
    )
    return waits.select(
        "*",
        F.col("dependency_failed_at").isNotNull().alias("failed_by_dependency"),
        seconds_between("created_at", F.coalesce("released_at", "dependency_failed_at"))
        .alias("wait_s"),
        seconds_between("not_before", "first_start").alias("start_lateness_s"),
    )


def ticks_table(raw: DataFrame) -> DataFrame:
    """One row per job a schedule made: how late after its tick it was made, and how late
    it started."""
    ticks = raw.where(F.col("tick").isNotNull()).select(
        "job_id", "schedule", "tick", "creator", job_status(), "created_at",
        first_event(named("started")).alias("first_start"))
    return ticks.select(
        "*",
        seconds_between("tick", "created_at").alias("creation_lateness_s"),
        seconds_between("tick", "first_start").alias("start_lateness_s"),
    )


def broadcasts_table(raw: DataFrame) -> DataFrame:
    """One row per broadcast step its creator opened: its fan-out (sites, how each
    ended), and how long the step waited for its slowest site after the fastest one
    finished (`lag_s`): what one slow site costs every broadcast."""
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
        F.array_min(ended["finish_time"]).alias("first_finish"),
        slowest["finish_time"].alias("last_finish"),
        slowest["site"].alias("slowest_site"),
    ).select(
        "*",
        seconds_between("first_finish", "last_finish").alias("lag_s"),
        seconds_between("opened_at", "last_finish").alias("span_s"),
    )


def parts_table(raw: DataFrame) -> DataFrame:
    """Each site's ended part of a broadcast step, as the sites table counts a step run:
    runnable when the creator opened the step (dropped sites' parts left out)."""
    parts = raw.select("history", F.posexplode("steps").alias("step", "s")) \
        .where(F.col("s.broadcast")) \
        .select("history", "step", F.col("s.start_time").alias("runnable_at"),
                F.explode("s.runs").alias("r")) \
        .where(~F.col("r.dropped") & F.col("r.status").isin(*RAN))
    site = F.col("r.site")
    return parts.select(
        site.alias("site"),
        F.col("r.exec_time").alias("exec_time_s"),
        F.exists("history", lambda e: (e["step"] == F.col("step")) & (e["site"] == site)
                 & gives(e, Reason.ALT_DO)).alias("alt_do_used"),
        seconds_between("runnable_at", "r.start_time").alias("overhead_s"),
    )


def sites_table(steps: DataFrame, parts: DataFrame, events: DataFrame, workers: int,
                window_s: float | None) -> DataFrame:
    """One row per site that ran steps (or parts of broadcast steps): busy time against
    `workers` slots over the window."""
    ran = steps.where(F.col("status").isin(*RAN) & F.col("site").isNotNull()) \
        .select("site", "exec_time_s", "alt_do_used", "overhead_s").unionByName(parts)
    work = ran.groupBy("site").agg(
        F.count("*").alias("steps"),
        F.round(F.coalesce(F.sum("exec_time_s"), F.lit(0.0)), 6).alias("busy_s"),
        F.count_if("alt_do_used").alias("alt_do_steps"),
        F.percentile("overhead_s", 0.5).alias("overhead_p50_s"),
        F.percentile("overhead_s", 0.95).alias("overhead_p95_s"),
    )
    # An execution's events (they name its worker): not the creator ending a step or a job.
    trouble = events.where(F.col("worker").isNotNull()).groupBy("site").agg(
        F.count_if(F.col("event") == "retried").alias("retries"),
        F.count_if(F.col("event") == "failed").alias("failures"),
    )
    window = F.lit(window_s).cast("double")
    return (
        work.join(trouble, "site", "left")
        .fillna(0, ["retries", "failures"])
        .select(
            "site", "steps", "busy_s", window.alias("window_s"), F.lit(workers).alias("workers"),
            F.try_divide("busy_s", F.lit(workers) * window).alias("utilisation"),
            "retries", "failures", "alt_do_steps", "overhead_p50_s", "overhead_p95_s",
        )
        .orderBy("site")
    )


def build_tables(raw: DataFrame, workers: int) -> tuple[dict[str, DataFrame], float | None]:
    """The tables by name, and the run's wall-clock window in seconds: the first step
    start anywhere to the last step finish anywhere."""
    steps = steps_table(raw).cache()
    events = events_table(raw).cache()  # read by four outputs: explode it once
    window_s = steps.agg(seconds_between(F.min("start_time"), F.max("finish_time"))) \
        .collect()[0][0]
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


def figures(df: DataFrame, spread: tuple[str, ...], **totals: Column) -> dict:
    """The `totals` over `df`, and the min, p50, p95, p99, max and mean of each column in
    `spread` (exact percentiles, nulls ignored), all in one Spark job."""

    def spread_of(column: str) -> Column:
        percentiles = F.percentile(column, [0.5, 0.95, 0.99])  # one aggregate, read thrice
        return F.struct(
            F.min(column).alias("min"), percentiles[0].alias("p50"),
            percentiles[1].alias("p95"), percentiles[2].alias("p99"),
            F.max(column).alias("max"), F.avg(column).alias("mean"),
        ).alias(column)

    named_totals = (total.alias(name) for name, total in totals.items())
    return df.agg(*map(spread_of, spread), *named_totals).collect()[0].asDict(recursive=True)


def counts(df: DataFrame, column: str, limit: int | None = None) -> dict[Any, int]:
    """How often each value of `column` occurs, most frequent first."""
    grouped = df.groupBy(column).count().orderBy(F.desc("count"), column)
    rows = grouped.limit(limit).collect() if limit else grouped.collect()
    return {row[column]: row["count"] for row in rows}


def wait_figures(waits: DataFrame) -> dict:
    found = figures(waits, ("wait_s", "start_lateness_s"), jobs=F.count("*"),
                    released=F.count("released_at"),
                    failed_by_dependency=F.count_if("failed_by_dependency"),
                    delayed=F.count("not_before"))
    ended = found["released"] + found["failed_by_dependency"]
    return found | {"not_released": found["jobs"] - ended}


def broadcast_figures(broadcasts: DataFrame) -> dict:
    found = figures(broadcasts, ("sites", "lag_s", "span_s"), steps=F.count("*"))
    found["sites_per_step"] = found.pop("sites")
    return found | {"slowest_sites": counts(broadcasts.where("slowest_site IS NOT NULL"),
                                            "slowest_site", limit=10)}


def summarise(tables: dict[str, DataFrame], workers: int, window_s: float | None) -> dict:
    jobs, ticks = tables["jobs"], tables["ticks"]
    summary = figures(
        jobs, ("makespan_s", "turnaround_s", "ideal_s", "makespan_ratio", "revisions"),
        jobs=F.count("*"), revisions_per_step=F.avg("revisions_per_step"),
        **{column: F.coalesce(F.sum(column), F.lit(0)) for column in SUMMED})
    summary["revisions_per_job"] = summary.pop("revisions")
    return summary | {
        "status": counts(jobs, "status"),
        "overhead_s": figures(tables["steps"], ("overhead_s",))["overhead_s"],
        "failure_reasons": counts(tables["failures"], "reason", limit=10),
        "window_s": window_s,
        "workers_per_site": workers,
        "sites": {row["site"]: row.asDict() for row in tables["sites"].collect()},
        "waits": wait_figures(tables["waits"]),
        "broadcast": broadcast_figures(tables["broadcasts"]),
        "ticks": figures(ticks, ("creation_lateness_s", "start_lateness_s"), ticks=F.count("*"))
        | {"by_schedule": counts(ticks, "schedule")},
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
