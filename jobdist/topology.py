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

What a replication document holds depends on the pushing server's kind
(`replication_doc`): Apache CouchDB 3 evaluates a Mango `selector` in Erlang,
where a JavaScript filter costs a couchjs call per document; pouchdb-server
crashes on a `selector`, so it keeps the JavaScript filters.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from .config import SiteConfig

EVERY_JOB = "jobdist/jobs"
JOBS_FOR_SITE = "jobdist/for_site"

Selector = dict[str, Any]


class ServerKind(StrEnum):
    """Which server a site runs: it decides what its replication documents hold."""

    COUCHDB = "couchdb"  # Apache CouchDB 3
    POUCHDB = "pouchdb"  # pouchdb-server


# The JavaScript filters' rules as Mango selectors, for Apache CouchDB; each
# must pass exactly what its filter in couch_design/jobdist/filters/ passes
# (tests/test_topology.py holds them side by side). Design documents stay home.
NOT_A_DESIGN_DOC: Selector = {"$not": {"_id": {"$regex": "^_design/"}}}
DELETION: Selector = {"_deleted": True}  # a deletion keeps no fields: always passed

# jobs.js: jobs, sites' status documents, schedules, and deletions.
EVERY_JOB_SELECTOR: Selector = {"$and": [NOT_A_DESIGN_DOC, {"$or": [
    DELETION, {"type": {"$in": ["job", "site", "schedule"]}}]}]}


def jobs_for_site_selector(site: str) -> Selector:
    """for_site.js for `site`: every site's status and every schedule, deletions, and
    the jobs `site` created or may run: a step whose target is "any" (also when the
    target is left out or null), "all", `site`, or a list holding one of them.
    `$in` on a list matches when any of its items is in ours; null and a missing
    field are spelt out because `$in` passes neither (null as `$eq`: pouchdb's
    `_find`, which tests this, misreads a bare null inside `$elemMatch`)."""
    may_run = {"$or": [{"target": {"$exists": False}}, {"target": {"$eq": None}},
                       {"target": {"$in": ["any", "all", site]}}]}
    return {"$and": [NOT_A_DESIGN_DOC, {"$or": [
        DELETION,
        {"type": {"$in": ["site", "schedule"]}},
        {"type": "job", "creator": site},
        {"type": "job", "job": {"$elemMatch": may_run}},
    ]}]}


# A full mesh replicates each revision over every one of its N(N-1) links: a
# site's server compares it with every peer (`_revs_diff`) whoever wrote it, so
# its cost a step grows as N^2. A star's 2(N-1) links grow as N. Past this many
# sites the star is faster (docs/performance.md, "Many sites"), so setup warns.
MESH_SITES_MAX = 3


def full_mesh_warning(sites: dict[str, SiteConfig]) -> str | None:
    """A warning when every site pushes to every other, past MESH_SITES_MAX sites."""
    if len(sites) <= MESH_SITES_MAX:
        return None
    if any(set(site.peers) != set(sites) - {name} for name, site in sites.items()):
        return None
    return (f"{len(sites)} sites in a full mesh: replication costs a step grow with the "
            f"square of the sites past {MESH_SITES_MAX}; a star (a hub with filtered "
            "replication to the others) grows linearly (docs/operations.md, \"Topology\")")


# Apache CouchDB 3's replication settings that differ from its defaults, for
# a trickle of small documents where the hop's latency matters (docs/operations.md,
# "Apache CouchDB: what JavaScript costs", replication settings):
COUCHDB_REPLICATION_SETTINGS: dict[str, Any] = {
    # Nagle's algorithm off (CouchDB's default leaves it on): a small request
    # (`_revs_diff`, `_bulk_docs`, `_bulk_get` of one job) is sent at once
    # instead of waiting for the previous segment's ACK.
    "socket_options": "[{keepalive, true}, {nodelay, true}]",
    # 10 s instead of 30 s: a peer that stopped answering (a dropped VPN, a
    # half-open connection) is given up and retried sooner; the changes feed's
    # heartbeat is a third of it. A job's documents answer in milliseconds.
    "connection_timeout": 10000,
}


@dataclass(frozen=True)
class Replication:
    """A push from `source` to its peer `target`."""

    source: SiteConfig
    target: SiteConfig

    @property
    def filter(self) -> str:
        """Only the jobs that concern the target from a filtered site, except to a relay."""
        if self.source.replication.filtered and not self.target.replication.relay:
            return JOBS_FOR_SITE
        return EVERY_JOB

    @property
    def doc_id(self) -> str:
        """The `_replicator` document id: its database's prefix, then the link."""
        prefix = owned_prefix(self.source.couch.database)
        return f"{prefix}{self.source.name}-to-{self.target.name}"

    @property
    def source_endpoint(self) -> str:
        return endpoint(self.source.couch.url, self.source.couch.database, self.source)

    @property
    def target_endpoint(self) -> str:
        url = self.source.replication.peer_urls.get(self.target.name, self.target.couch.url)
        return endpoint(url, self.target.couch.database, self.source)

    @property
    def selector(self) -> Selector:
        """The Mango selector that passes what `filter` passes."""
        if self.filter == JOBS_FOR_SITE:
            return jobs_for_site_selector(self.target.name)
        return EVERY_JOB_SELECTOR


def replication_doc(link: Replication, kind: ServerKind) -> dict[str, Any]:
    """The `_replicator` document for `link` on the pushing site's server of `kind`.

    Apache CouchDB 3 gets a selector, URLs at both ends (it takes nothing else)
    and COUCHDB_REPLICATION_SETTINGS. pouchdb-server gets the JavaScript filter,
    reads its own database by name (in process, where a URL costs a `_changes`
    request and a `_bulk_get` over HTTP for every batch: half of a push's
    requests), and no checkpoints: it would write them at both ends after every
    batch, a quarter of its requests.
    """
    doc: dict[str, Any] = {"target": link.target_endpoint, "continuous": True}
    if kind is ServerKind.COUCHDB:
        return doc | {"source": link.source_endpoint, "selector": link.selector,
                      **COUCHDB_REPLICATION_SETTINGS}
    doc |= {"source": link.source.couch.database, "filter": link.filter, "checkpoint": False}
    if link.filter == JOBS_FOR_SITE:
        doc["query_params"] = {"site": link.target.name}
    return doc


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
    return [Replication(site, sites[peer]) for site in sites.values() for peer in site.peers]


JOBS_DATABASE = "jobs"


def owned_prefix(database: str) -> str:
    """What starts the id of every replication document of `database`, and of no other
    database's: `jobdist-` for `jobs` (the ids deployed sites have always had),
    `jobdist:DATABASE:` for any other (neither a site name nor a database name holds a
    colon). Setup removes stale replications of the database it sets up only."""
    return "jobdist-" if database == JOBS_DATABASE else f"jobdist:{database}:"
