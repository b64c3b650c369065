"""Site topologies: which replications a set of sites needs.

Each site pushes to each of its `peers`, so a pair of peers replicates both
ways. The topology is the peers lists: a full mesh (every pair, as the thesis
ran it) or a star (a hub and spokes, the thesis's 4.3 proposal: (N-1) links
both ways instead of N(N-1)).

With `filtered = true`, a site pushes to a peer only the jobs that concern it
(the `for_site` filter: jobs it created or may run, thesis 7.2), except to a
peer marked `relay = true` (a hub), which must receive everything to pass it on.
A site reaches a peer at the peer's `couch.url` unless its `[replication]
peer_urls` names another address (a gateway, a VPN end, or a fault proxy).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

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
    def source_endpoint(self) -> str:
        return endpoint(self.source.couch.url, self.source.couch.database, self.source)

    @property
    def target_endpoint(self) -> str:
        url = self.source.replication.peer_urls.get(self.target.name, self.target.couch.url)
        return endpoint(url, self.target.couch.database, self.source)


def endpoint(couch_url: str, database: str, login: SiteConfig) -> str:
    """A database URL for the replicator, with `login`'s credentials in it: the
    replicator runs inside CouchDB and must log in to both ends. A replication
    logs in as the site that pushes (its user exists on every site)."""
    url = f"{couch_url.rstrip('/')}/{database}"
    if login.couch.user is None:
        return url
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    userinfo = quote(login.couch.user, safe="") + (
        f":{quote(login.couch.password, safe='')}" if login.couch.password else "")
    return urlunsplit((parts.scheme, f"{userinfo}@{host}", parts.path, parts.query,
                       parts.fragment))


def replications(sites: dict[str, SiteConfig]) -> list[Replication]:
    """Every push replication the sites' configs call for."""
    wanted = []
    for site in sites.values():
        for peer_name in site.peers:
            peer = sites[peer_name]
            if site.replication.filtered and not peer.replication.relay:
                wanted.append(Replication(site, peer, JOBS_FOR_SITE, {"site": peer.name}))
            else:
                wanted.append(Replication(site, peer, EVERY_JOB, None))
    return wanted


OWNED_PREFIX = "jobdist-"


def owned_by_us(doc_id: str) -> bool:
    return doc_id.startswith(OWNED_PREFIX)
