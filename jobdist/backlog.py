"""The open steps this site may take, as the changes feed and its own writes show them.

A freed worker finds its next step here, in line order (core.claim_rank), without
asking the server: two `claimable` view queries for every freed worker cost the
manager 40 % of its time under a burst (docs/performance.md). The view stays the
safety net for what the feed did not show (a daemon that just started, a change it
never decoded): PeriodicWork.claimable_due queries it now and then.

An entry is a hint, never a decision: the job is read (or known) and decided as
any other. The newest revision the site looked at keeps each entry true: a change
from the feed, a revision we wrote, the merge of the leaves a decision read.
"""

from __future__ import annotations

import itertools
from collections.abc import Container, Iterator
from typing import Any, cast

from sortedcontainers import SortedList

from . import core
from .model import ALL, ANY, Doc, Leaf, is_waiting

TAKEN_FIELDS = ("claimed_by", "winner", "step_status")  # any of them set: not open


def open_targets(doc: Leaf) -> list[str]:
    """The targets whose rows the `claimable` view has for this document (its map
    function, couch_design/jobdist/views/claimable/map.js, in Python): the sites
    whose part of an opened broadcast step waits, or an open plain step's targets."""
    jobs = doc.get("job")
    index = 0 if doc.get("step") is None else doc["step"]
    if doc.get("type") != "job" or doc.get("job_status") is not None or doc.get("_deleted") \
            or not isinstance(jobs, list) or not isinstance(index, int) \
            or not 0 <= index < len(jobs) or not isinstance(jobs[index], dict) or is_waiting(doc):
        return []
    step: dict[str, Any] = jobs[index]
    runs = step.get("runs")
    if isinstance(runs, dict) and step.get("step_status") == "running":
        dropped = step.get("dropped")
        dropped = dropped if isinstance(dropped, list) else []
        return [site for site, run in runs.items()
                if isinstance(run, dict) and run.get("status") is None and site not in dropped]
    if any(step.get(name) is not None for name in TAKEN_FIELDS) \
            or step.get("target") == ALL or step.get("each") is True:
        return []
    target = ANY if step.get("target") is None else step["target"]
    return [str(name) for name in target] if isinstance(target, list) else [str(target)]


MAX_KEPT = 5_000  # revisions kept for a start with no read: about 2 KB each
Place = tuple[int, int, str, int]  # core.line_place


class Backlog:
    """Open steps that name this site or "any", each with its place in line, and for up
    to MAX_KEPT of them the revision that showed it open: a freed worker's decision
    made on it needs no read (manager.Task.known; a 409 says it changed)."""

    def __init__(self, site: str) -> None:
        self.site = site
        self.open: dict[str, Place] = {}  # each open step's job, and its core.line_place
        # The same, in line order: a freed worker's next step is found by reading the
        # first few, not by sorting them all (under a burst of 1,000 jobs that sort was
        # a twentieth of the daemon's CPU).
        self.line: SortedList[tuple[Place, str]] = SortedList()
        self.kept: dict[str, Doc] = {}

    def saw(self, doc_id: str, doc: Leaf | None, whole: bool = True) -> None:
        """The newest revision we looked at: open here, or not (None: unreadable).
        `whole`: one leaf as stored (not a merge of several), which a write may extend."""
        wanted = open_targets(doc) if doc is not None else []
        self.kept.pop(doc_id, None)
        before = self.open.pop(doc_id, None)
        if before is not None:
            self.line.remove((before, doc_id))
        if self.site not in wanted and ANY not in wanted:
            return
        assert doc is not None
        place = self.open[doc_id] = core.doc_place(self.site, doc_id, doc)
        self.line.add((place, doc_id))
        if whole and not doc.get("_conflicts") and len(self.kept) < MAX_KEPT:
            self.kept[doc_id] = cast(Doc, doc)

    def created_here(self, limit: int, passed: Container[str]) -> list[tuple[str, Doc]]:
        """Of the open steps whose revision we kept, the `limit` first in line of the jobs
        this site created, with that revision: what a creator gives sites with room."""
        ours = (doc_id for doc_id in self._in_line(passed)
                if doc_id in self.kept and self.kept[doc_id].get("creator") == self.site)
        return [(doc_id, self.kept[doc_id]) for doc_id in itertools.islice(ours, limit)]

    def first(self, limit: int, passed: Container[str]) -> list[str]:
        """The `limit` first jobs in line, leaving out those in `passed`."""
        return list(itertools.islice(self._in_line(passed), limit))

    def _in_line(self, passed: Container[str]) -> Iterator[str]:
        return (doc_id for _, doc_id in self.line if doc_id not in passed)
