"""Site topologies: which replications a set of sites needs.

Each site pushes to each of its `peers`, so a pair of peers replicates both
ways. The topology is the peers lists: a full mesh (every pair, as the thesis
ran it) or a star (a hub and spokes, the thesis's 4.3 proposal: (N-1) links
both ways instead of N(N-1)).

With `filtered = true`, a site pushes to a peer only the jobs that concern it
(the `for_site` filter: jobs it created or may run, thesis 7.2), except to a
peer marked `relay = true` (a hub), which must receive everything to pass it on.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import SiteConfig

EVERY_JOB = "jobdist/jobs"
JOBS_FOR_SITE = "jobdist/for_site"


@dataclass(frozen=True)
class Replication:
    source: SiteConfig
    target: SiteConfig
    filter: str
    query_params: dict[str, str] | None

    @property
    def doc_id(self) -> str:
        """The `_replicator` document id; the prefix marks the ones we own."""
        return f"jobdist-{self.source.name}-to-{self.target.name}"

    @property
    def source_url(self) -> str:
        return f"{self.source.couch_url}/{self.source.database}"

    @property
    def target_url(self) -> str:
        return f"{self.target.couch_url}/{self.target.database}"


def replications(sites: dict[str, SiteConfig]) -> list[Replication]:
    """Every push replication the sites' configs call for."""
    wanted = []
    for site in sites.values():
        for peer_name in site.peers:
            peer = sites[peer_name]
            if site.filtered and not peer.relay:
                wanted.append(Replication(site, peer, JOBS_FOR_SITE, {"site": peer.name}))
            else:
                wanted.append(Replication(site, peer, EVERY_JOB, None))
    return wanted


def owned_by_us(doc_id: str) -> bool:
    return doc_id.startswith("jobdist-")
