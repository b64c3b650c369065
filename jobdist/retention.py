"""Retention: remove finished jobs past a retention period, after exporting them.

A finished job (`success`, `failed` or `cancelled`) whose last update is older
than the period is *expired*. Removing one deletes every live leaf revision
of its document at one site; replication carries the deletions to the other
sites (the `jobs` filter passes `_deleted`). The steps, usable alone (the
creator's daemon can run `cleanup` periodically) or through `jobdist cleanup`:

    find_expired(db, cutoff)    expired jobs, merged from all their leaves,
                                read a window of the `finished_before` view at a time
    export_jobs(jobs, file)     one merged document per JSON line, flushed and synced
    delete_jobs(db, jobs)       delete exactly the leaf revisions that were read

Only what was read (and exported) is deleted: a job written to since is not
deleted (its deletion conflicts) and is reported as changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from .clock import format_time
from .core import merge
from .couch import Conflict, Database, Rejected, Saved
from .couch_views import iter_view
from .design import DDOC
from .model import FINAL_STATUSES, Doc, as_doc, newer_format
from .periodic import Periodic

VIEW = "finished_before"  # key: updated_at of finished jobs

@dataclass(frozen=True)
class Expired:
    """An expired job: its merged document and the leaf revisions it was merged from."""

    id: str
    doc: Doc
    revs: tuple[str, ...]


def is_expired(doc: Doc, cutoff: str) -> bool:
    """Finished, and last updated before `cutoff`: a job no site has written yet (its
    `updated_at` still the default, null) has no age, and is kept."""
    updated = doc.get("updated_at")
    return doc.get("job_status") in FINAL_STATUSES and updated is not None and updated < cutoff


def find_expired(db: Database, cutoff: str, *, window: int = 200, page_size: int = 200,
                 creator: str | None = None) -> Iterator[Expired]:
    """Every expired job at this site, oldest update first, a window at a time.

    Each window is read from the view completely (paginated) before any of it
    is yielded, so deleting what was yielded never shifts a page under the
    reader; the next window starts after the last key of the previous one.
    A window ends at a key boundary, so jobs updated at the same instant are
    never split. The view shows CouchDB's winning revision: each candidate is
    re-read with all its leaves and yielded only if the merge is expired too.
    With `creator`, only the jobs created at that site (a daemon cleans its own).
    """
    after: str | None = None
    while True:
        ids = _window(db, cutoff, after, window, page_size)
        if not ids:
            return
        for job in _load(db, [doc_id for doc_id, _ in ids], cutoff):
            if creator is None or job.doc.get("creator") == creator:
                yield job
        after = ids[-1][1]


def _window(db: Database, cutoff: str, after: str | None, size: int,
            page_size: int) -> list[tuple[str, str]]:
    params: dict[str, Any] = {"endkey": cutoff, "inclusive_end": False}
    if after is not None:
        params["startkey"] = after
    found: list[tuple[str, str]] = []
    with contextlib.closing(iter_view(db, DDOC, VIEW, page_size=page_size, **params)) as rows:
        for row in rows:
            key = row["key"]
            if after is not None and key <= after:
                continue  # the previous window's last key: done already
            if len(found) >= size and key != found[-1][1]:
                break
            found.append((row["id"], key))
    return found


def _load(db: Database, ids: list[str], cutoff: str) -> list[Expired]:
    expired = []
    for doc in db.bulk_get(ids, conflicts=True):
        if doc.get("_deleted"):
            continue
        leaves = db.leaves(doc["_id"]) if doc.get("_conflicts") else [doc]
        leaves = [leaf for leaf in leaves if leaf.get("type") == "job"]
        if not leaves or any(newer_format(leaf) for leaf in leaves):
            continue  # (a newer release's job: its own sites clean it up)
        merged = as_doc(merge(leaves))
        if is_expired(merged, cutoff):
            merged.pop("_conflicts", None)
            expired.append(Expired(merged["_id"], merged,
                                   tuple(leaf["_rev"] for leaf in leaves)))
    return expired


def export_jobs(jobs: Iterable[Expired], out: IO[str]) -> list[Expired]:
    """Write each job's merged document as one JSON line; sync; return what was written."""
    written = []
    for job in jobs:
        out.write(json.dumps(job.doc, ensure_ascii=False, separators=(",", ":")) + "\n")
        written.append(job)
    out.flush()
    # Not a real file (a test's StringIO): nothing to sync.
    with contextlib.suppress(AttributeError, OSError, ValueError):
        os.fsync(out.fileno())
    return written


@dataclass
class Deleted:
    jobs: int = 0  # jobs whose every read leaf was deleted
    revisions: int = 0  # leaf revisions deleted
    changed: list[str] = field(default_factory=list)  # written to since they were read: kept
    refused: list[str] = field(default_factory=list)  # "id: reason" the server refused


def delete_jobs(db: Database, jobs: Iterable[Expired], result: Deleted | None = None) -> Deleted:
    """Delete exactly the leaf revisions each job was read with; counted in `result` (new
    unless given).

    A leaf that is no longer a leaf (someone wrote on top of it) conflicts:
    the job changed after it was read (and exported), so it counts as changed.
    One `_bulk_docs` request per round, each id at most once per round.
    """
    result = result or Deleted()
    jobs = list(jobs)
    failed: set[str] = set()
    rounds = max((len(job.revs) for job in jobs), default=0)
    for index in range(rounds):
        batch = [{"_id": job.id, "_rev": job.revs[index], "_deleted": True}
                 for job in jobs if index < len(job.revs) and job.id not in failed]
        for outcome in db.bulk_docs(batch):
            if isinstance(outcome, Saved):
                result.revisions += 1
            elif isinstance(outcome, Conflict):
                failed.add(outcome.id)
                result.changed.append(outcome.id)
            elif isinstance(outcome, Rejected):
                failed.add(outcome.id)
                result.refused.append(f"{outcome.id}: {outcome.error}: {outcome.reason}")
    result.jobs += sum(1 for job in jobs if job.id not in failed)
    return result


@dataclass
class Report:
    cutoff: str
    found: int = 0
    exported: int = 0
    deleted: Deleted = field(default_factory=Deleted)
    dry_run: bool = False


def cleanup(db: Database, older_than: timedelta, *, export: IO[str] | None = None,
            dry_run: bool = False, batch: int = 200, now: datetime | None = None,
            creator: str | None = None) -> Report:
    """Remove (or with dry_run only count) the expired jobs, exporting each batch first."""
    # Expired: finished, and last updated before this.
    report = Report(format_time((now or datetime.now(UTC)) - older_than), dry_run=dry_run)
    pending: list[Expired] = []

    def flush() -> None:
        if not pending:
            return
        done = pending
        if export is not None:
            done = export_jobs(pending, export)
            report.exported += len(done)
        delete_jobs(db, done, report.deleted)
        pending.clear()

    for job in find_expired(db, report.cutoff, window=batch, creator=creator):
        report.found += 1
        if dry_run:
            continue
        pending.append(job)
        if len(pending) >= batch:
            flush()
    flush()
    return report


class PeriodicCleanup(Periodic):
    """A daemon's retention: every `interval`, remove the finished jobs it created
    that are past `older_than`, exported first when `export` is set."""

    what = "retention pass"

    def __init__(self, db: Database, site: str, older_than: timedelta, interval: float,
                 export: Path | None, stop: threading.Event) -> None:
        super().__init__("retention", site, stop, "jobdist.retention")
        self.db = db
        self.older_than = older_than
        self.interval = interval
        self.export = export

    def wait_before_pass(self) -> float:
        return self.interval

    def pass_once(self) -> Report:
        export = self.export
        with open(export, "a", encoding="utf-8") if export else contextlib.nullcontext() as out:
            report = cleanup(self.db, self.older_than, export=out, creator=self.site)
        if report.deleted.jobs:
            self.log.info("retention removed", jobs=report.deleted.jobs, cutoff=report.cutoff)
        return report
