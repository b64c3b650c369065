"""`jobdist report`'s source: a site's CouchDB read into one Spark row per job.

The driver lists job ids only (the `by_status` view: every document of type
job, whatever its id); the executors fetch their share of the documents over
HTTP, so no single process ever holds every document. Each document becomes
one row with its steps and history as nested arrays (`JOB`); a job that
breaks the job rules becomes a row that says why, and the tables leave it out.
Starting the Spark session that does this is here too.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobdist.config import SiteConfig
from jobdist.couch import Couch, Database
from jobdist.couch_views import iter_view
from jobdist.design import PEOPLE_DDOC
from jobdist.errors import JobdistError
from jobdist.model import Leaf, awaited, dropped_sites, is_broadcast, normalise, sub_runs
from jobdist.validation import validate_job

ID_PAGE = 1000  # rows per page of the view that lists the job ids on the driver
SKIPPED_REASON_LENGTH = 200  # characters of the first rule a skipped job breaks
IDS_PER_PARTITION = 2000  # documents one task fetches and holds at a time

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
        filter(None, [str(Path(__file__).resolve().parents[2]),
                      os.environ.get("PYTHONPATH")])),
}

Fields = list[tuple[str, str]]  # (name, Spark type) of a row's values, in their order


def fields(spec: str) -> Fields:
    """`"name type, name type"` as fields; the types are flat (no commas in them)."""
    return [(name, kind) for name, kind in (part.split() for part in spec.split(", "))]


def struct(of: Fields) -> str:
    return "struct<" + ", ".join(f"{name}: {kind}" for name, kind in of) + ">"


# The rows' schema and the rows themselves (`row`) come from these, so they cannot drift.
RUN = fields("site string, status string, dropped boolean, attempts int, exit_code int, "
             "exec_time double, start_time timestamp, finish_time timestamp")
STEP = [*fields("target string, targeted boolean, epoch int, winner string, "
                "executioner string, step_status string, exec_time double, "
                "start_time timestamp, finish_time timestamp, attempts int, exit_code int, "
                "progress double, progress_message string, broadcast boolean"),
        ("runs", f"array<{struct(RUN)}>")]
EVENT = fields("event string, step int, site string, worker string, epoch int, at timestamp, "
               "detail string, reason string")
JOB = [*fields("job_id string, creator string, priority int, job_status string, "
               "current_step int, created_at timestamp, updated_at timestamp, revisions int"),
       ("steps", f"array<{struct(STEP)}>"), ("history", f"array<{struct(EVENT)}>"),
       *fields("after_count int, not_before timestamp, schedule string, tick timestamp, "
               "skipped string")]  # skipped: why the tables leave the job out


class ReportError(JobdistError):
    """A failure a person can act on; the message is one line without credentials."""


@dataclass(frozen=True)
class CouchSource:
    """The jobs database and how to log in to it: what the driver and every executor
    connect with (the password travels to the executors, and is never shown)."""

    url: str
    database: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def of_site(cls, site: SiteConfig) -> CouchSource:
        """A site's database with its credentials (file or environment, as its config says)."""
        couch = site.couch
        return cls(couch.url, couch.database, couch.user, couch.password)

    def open(self) -> Database:
        return Couch(self.url, user=self.user, password=self.password).database(self.database)


# -- the driver: which documents exist ------------------------------------------------


def list_job_ids(database: Database, page_size: int = ID_PAGE) -> list[str]:
    """The id of every document of type job, malformed ones too, in pages of the
    `by_status` view without documents: design, site status and schedule documents
    are not jobs, and a job's id need not start with `job-` (one POSTed over HTTP)."""
    rows = iter_view(database, PEOPLE_DDOC, "by_status", page_size=page_size, reduce=False)
    return [row["id"] for row in rows]


# -- the executors: fetch documents and shape them as rows ----------------------------


def fetch_partition(source: CouchSource, ids: Iterable[str]) -> Iterator[tuple]:
    """The job rows for `ids`, fetched by whichever executor runs this partition; a job
    that breaks the job rules (written before they held) as a skipped row."""
    database = source.open()
    for doc in database.bulk_get(list(ids)):
        if doc.get("type") != "job":  # replaced since it was listed
            continue
        if broken := validate_job(doc):
            yield row(JOB, {}, job_id=doc["_id"], skipped=broken[0][:SKIPPED_REASON_LENGTH])
        else:
            yield job_row(doc)


def job_row(doc: Leaf) -> tuple:
    """A job document as a `JOB` row; a field it leaves out reads as its default (a job
    written over HTTP)."""
    doc = normalise(doc)
    made_by: Leaf = doc.get("schedule") or {}  # validated: {name, tick}, if a schedule made it
    return row(JOB, doc, job_id=doc["_id"], current_step=_int(doc.get("step")),
               revisions=_int(str(doc.get("_rev", "0")).split("-")[0]),
               steps=[step_row(step) for step in doc.get("job") or []],
               history=[row(EVENT, event) for event in doc.get("history") or []],
               after_count=len(awaited(doc)),  # waiting: how many jobs it names, and its time
               schedule=made_by.get("name"), tick=_moment(made_by.get("tick")), skipped=None)


def step_row(step: Leaf) -> tuple:
    target = step.get("target")
    targets = [str(t) for t in target] if isinstance(target, list) else [str(target)]
    progress = step.get("progress") or {}  # its last report, validated: {fraction, message}
    return row(STEP, step, target=",".join(targets),
               targeted=len(targets) == 1 and targets[0] != "any",
               progress=_float(progress.get("fraction")), progress_message=progress.get("message"),
               broadcast=is_broadcast(step),
               runs=[row(RUN, run, site=site, dropped=site in dropped_sites(step))
                     for site, run in sorted(sub_runs(step).items())])


def row(of: Fields, doc: Leaf, **made: Any) -> tuple:
    """The values of the fields `of` in `doc`, each read as its Spark type (a string as it
    is); `made` gives those that are not plain fields of `doc`."""
    return tuple(made[name] if name in made else READ.get(kind, lambda value: value)(doc.get(name))
                 for name, kind in of)


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


READ: dict[str, Callable[[Any], Any]] = {"int": _int, "double": _float, "timestamp": _moment}


def load_jobs(spark: SparkSession, source: CouchSource, ids: list[str]) -> DataFrame:
    """One row per job, fetched by the executors and kept (memory, then disk) for reuse."""
    partitions = max(spark.sparkContext.defaultParallelism,
                     math.ceil(len(ids) / IDS_PER_PARTITION), 1)
    fetch = functools.partial(fetch_partition, source)
    rows = spark.sparkContext.parallelize(ids, partitions).mapPartitions(fetch)
    raw = spark.createDataFrame(rows, struct(JOB), verifySchema=False)
    return raw.persist(StorageLevel.MEMORY_AND_DISK)


def skipped_jobs(raw: DataFrame) -> list[dict[str, str]]:
    """The jobs the tables leave out, by id: {"job_id", "reason"} each."""
    skipped = raw.where(F.col("skipped").isNotNull()).orderBy("job_id")
    return [row.asDict() for row in skipped.select("job_id", F.col("skipped").alias("reason"))
            .collect()]


# -- Spark session ---------------------------------------------------------------------


def require_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if not (Path(java_home, "bin", "java").exists() if java_home else shutil.which("java")):
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
    local = master.startswith("local")
    builder = SparkSession.builder.master(master).appName("jobdist-report") \
        .config(map={**SPARK_CONF, **(LOCAL_SPARK_CONF if local else {})})
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
    found = re.findall(r"jobdist\.couch\.\w+: (.+)", str(error))
    return ReportError(found[-1].strip() if found else f"Spark job failed: {_first_line(error)}")
