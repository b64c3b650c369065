"""`jobdist bench`: our speed against the thesis's figures and the server's own limits.

Every benchmark starts fresh local sites (pouchdb-server keeping its data on
disk, as `jobdist cluster up` runs it, unless `jobdist bench --in-memory`; one
daemon per site) in a temporary directory and stops them afterwards; with
`jobdist bench --deployment DIR`, throughput, thesis and priorities run on that
deployment's servers instead, in a database of their own (jobdist.lab.deployment).
Figures
that depend on this machine's load are also given as ratios measured in the
same run (against the ideal makespan, the same server's raw write rate, the
thesis's estimate), so they can be compared across runs. docs/performance.md
says what each figure means, what bounds it and how it was measured.

One module a benchmark; `common` holds the command group and what they share.
"""

from . import feed, memory, priorities, replication, targets, thesis, throughput
from .common import bench

__all__ = ["bench", "feed", "memory", "priorities", "replication", "targets", "thesis",
           "throughput"]
