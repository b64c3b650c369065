"""Which leaves of a job this site may act on, and the jobs it leaves alone.

Validation guards what the core acts on: a leaf that breaks the rules (written
where validation was off) is reported once and left out (core.usable_leaves). A
job with no valid leaf, one nothing can be decoded of, or one whose write the
server refuses is skipped until a new revision of it arrives on the feed, and so
is a job of a newer format than this release reads (a site not upgraded yet).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from typing import Any

from . import core
from .logs import EventLog
from .memo import remember
from .model import JOB_FORMAT, Doc, Job, newer_format
from .validation import validate_job

MAX_SKIPPED = 10_000  # jobs remembered as not to be acted on until they change
MAX_VERDICTS = 10_000  # revisions whose validation we remember

Found = tuple[list[Job], list[core.Unusable]]  # a job's usable leaves, and the others


class Verdicts:
    def __init__(self, counts: Counter[str], log: EventLog, reported: deque[str]) -> None:
        self.counts = counts
        self.log = log
        self.reported = reported  # revisions reported (or written) already
        # Jobs nothing can be done about until a new revision arrives, and why: scans
        # pass them by.
        self.skipped: OrderedDict[str, str] = OrderedDict()
        self._errors: dict[tuple[Any, Any], list[str]] = {}

    def usable(self, doc_id: str, leaves: list[Doc]) -> Found | None:
        """The job's leaves to merge, and the others; None (skipped) when none is."""
        jobs = [leaf for leaf in leaves if is_job_leaf(leaf)]
        newest = max((newer_format(leaf) or 0 for leaf in jobs), default=0)
        if newest:
            self.skip(doc_id, f"format {newest} is newer than this jobdist reads "
                              f"({JOB_FORMAT}): left alone until this site is upgraded")
            return None
        usable, rejected = core.usable_leaves(jobs, self.errors)
        for rev, reason in rejected:
            self._report_invalid(doc_id, rev, reason)
        if not usable:
            if jobs:  # not a deletion: a job nothing can be done about as it stands
                # (each of its revisions was logged as invalid: one line says it)
                self._remember_skipped(doc_id, "no valid revision")
            return None
        return usable, rejected

    def errors(self, leaf: Doc) -> list[str]:
        """validate_job, remembered by revision: a revision's content never changes,
        and checking a whole document at every decision was a fifth of the manager's
        time under load."""
        key = (leaf.get("_id"), leaf.get("_rev"))
        errors = self._errors.get(key)
        if errors is None:
            errors = validate_job(leaf)
            remember(self._errors, key, errors, MAX_VERDICTS)
        return errors

    def passed(self, doc_id: str, rev: str) -> None:
        """The server took this revision through validate_doc_update: valid."""
        remember(self._errors, (doc_id, rev), [], MAX_VERDICTS)

    def skip(self, doc_id: str, reason: str) -> None:
        """Leave the job alone until a new revision of it arrives on the feed."""
        if doc_id not in self.skipped:
            self.log.warning("job skipped until it changes", job=doc_id, reason=reason)
        self._remember_skipped(doc_id, reason)

    def _remember_skipped(self, doc_id: str, reason: str) -> None:
        if doc_id not in self.skipped:
            self.counts["jobs_skipped"] += 1
        remember(self.skipped, doc_id, reason, MAX_SKIPPED)

    def _report_invalid(self, doc_id: str, rev: str, reason: str) -> None:
        if rev in self.reported:
            return
        self.reported.append(rev)  # report each bad revision once
        self.counts["invalid_documents"] += 1
        self.log.error("invalid revision ignored", job=doc_id, rev=rev, error=reason)


def is_job_leaf(leaf: Doc) -> bool:
    """A leaf that says it is a job, not a deletion (the others are not ours to judge)."""
    return leaf.get("type") == "job" and not leaf.get("_deleted")
