"""What this site has seen of each job's revisions, so it can act without a read.

`newest` is the newest revision known of each job that runs here (its own last
write, or the feed's since): the next decision about it is planned on that and
written with its `_rev`; a 409 says it was not the newest. `depth` is the
deepest revision seen of every job (feed, reads, own writes): a start planned on
an older one is not launched ahead of its write.
"""

from __future__ import annotations

from .memo import remember
from .model import Doc, Job

MAX_KNOWN = 1_000  # jobs running here whose newest revision we keep
MAX_DEPTHS = 100_000  # jobs whose deepest revision seen we remember


class RevisionsSeen:
    def __init__(self) -> None:
        self.newest: dict[str, Doc] = {}
        self.depth: dict[str, int] = {}

    def known(self, doc_id: str) -> Doc | None:
        return self.newest.get(doc_id)

    def heard(self, doc_id: str, rev: str, doc: Doc | None) -> None:
        """The feed brought a revision: kept as the newest of a job that runs here,
        unless ours is newer."""
        known = self.newest.get(doc_id)
        if known is not None and doc is not None and generation(rev) >= generation(known["_rev"]):
            self.newest[doc_id] = doc
        self.saw(doc_id, rev)

    def saw(self, doc_id: str, rev: str) -> None:
        depth = max(generation(rev), self.depth.get(doc_id, 0))
        remember(self.depth, doc_id, depth, MAX_DEPTHS)

    def keep_newest(self, doc_id: str, doc: Doc, runs_here: bool) -> None:
        remember(self.newest, doc_id, doc if runs_here else None, MAX_KNOWN)

    def is_deepest(self, doc: Job | None) -> bool:
        """Is this revision made on the deepest revision of its job seen? (A change the
        feed delivered may be older than what we wrote since.)"""
        return doc is not None and generation(doc.get("_rev") or "") >= \
            self.depth.get(doc["_id"], 0)


def generation(rev: str) -> int:
    """A revision's number: how many edits deep it is ("3-abc" -> 3)."""
    head = rev.partition("-")[0]
    return int(head) if head.isdigit() else 0
