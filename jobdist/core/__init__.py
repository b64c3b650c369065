"""The decision core: what one site does about one job. Pure: no I/O, no clock.

Every site runs the same rules on the same inputs: the live leaf revisions of a
job document (all of them, not only CouchDB's winner), the site's name and the
state of its workers. The answer is a Plan: at most one new revision to write
on top of CouchDB's winning leaf, the losing leaves to delete (the creator
alone does that), and local effects to carry out before and after the write.

The package reads in three layers; each module imports only from the layers
below it (tests/test_boundaries.py checks it):

- The safety path, which no scheduling policy touches:
  `types` (inputs, decisions, plans), `leaves` (merging a job's leaves by
  progress), `edits` (how each decision changes the document), `fencing`
  (which runs and bookings the document still backs), `revision` (the
  revision a plan writes: conflicts cleaned, under the size limit),
  `succession` (adoption terms, who takes over from a silent creator).
- Policy and features, each one module: `placement` (the line, room,
  claim hold, queue and keep-alive picks), `wait` (jobs that wait for other
  jobs or a time), `starts` (the start decision, launch ahead and the start
  written late), `broadcast` (one part at each site).
- Composition: `decide` (the one decision about a job), `finish` (recording
  a run's end and chaining the next step), `plans` (the other writes:
  renew, event, cancel, adopt, drop, keep-alive, refusal).

This module exposes what the rest of jobdist uses.
"""

from .broadcast import (
    drop_problem,
)
from .decide import (
    plan,
)
from .edits import (
    record_outcome,
    start,
)
from .fencing import (
    backs_execution,
    current_leases,
    records_start,
    sub_run_open,
)
from .finish import (
    plan_finish,
)
from .leaves import (
    couch_order,
    merge,
    progress_rank,
    usable_leaves,
)
from .placement import (
    AGING_SECONDS,
    UNKNOWN_ROOM,
    UNSTAMPED_BAND,
    claim_rank,
    doc_place,
    doc_rank,
    line_place,
    resave_picks,
    spread,
)
from .plans import (
    keepalive,
    plan_adopt,
    plan_cancel,
    plan_drop,
    plan_refused,
    plan_renew,
    plan_retried,
)
from .revision import (
    fit,
)
from .starts import (
    follows,
)
from .types import (
    BOOKING_TIMEOUT,
    CLAIM_DELAY,
    CREATOR_TIMEOUT,
    FED_CLAIM_DELAY,
    LEASE,
    NOTHING,
    SKEW_MARGIN,
    Action,
    Assign,
    Book,
    Booking,
    Context,
    Effect,
    Kill,
    Launch,
    Plan,
    PoolView,
    Queue,
    Revoke,
    Running,
    Unbook,
    Unusable,
    claim_delay_for,
)

__all__ = [
    "AGING_SECONDS",
    "BOOKING_TIMEOUT",
    "CLAIM_DELAY",
    "CREATOR_TIMEOUT",
    "FED_CLAIM_DELAY",
    "LEASE",
    "NOTHING",
    "SKEW_MARGIN",
    "UNKNOWN_ROOM",
    "UNSTAMPED_BAND",
    "Action",
    "Assign",
    "Book",
    "Booking",
    "Context",
    "Effect",
    "Kill",
    "Launch",
    "Plan",
    "PoolView",
    "Queue",
    "Revoke",
    "Running",
    "Unbook",
    "Unusable",
    "backs_execution",
    "claim_delay_for",
    "claim_rank",
    "couch_order",
    "current_leases",
    "doc_place",
    "doc_rank",
    "drop_problem",
    "fit",
    "follows",
    "keepalive",
    "line_place",
    "merge",
    "plan",
    "plan_adopt",
    "plan_cancel",
    "plan_drop",
    "plan_finish",
    "plan_refused",
    "plan_renew",
    "plan_retried",
    "progress_rank",
    "record_outcome",
    "records_start",
    "resave_picks",
    "spread",
    "start",
    "sub_run_open",
    "usable_leaves",
]
