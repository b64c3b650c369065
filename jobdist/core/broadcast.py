"""Broadcast steps: one part (sub-run) at each site (docs/protocol.md, "Broadcast steps").

Who writes what: the creator opens the step (names its sites), revokes expired
part leases, records an operator's drop and ends the step; each site starts,
renews, finishes or releases its own part and no other. So no two sites ever
compete for one part, and the step's own phase has a single writer.
"""

from __future__ import annotations

from ..model import (
    ALL,
    ANY,
    Job,
    Step,
    counting_runs,
    dropped_sites,
    each_policy,
    is_broadcast,
    is_live,
    new_sub_run,
    sub_runs,
    targets,
)
from .edits import (
    current_step,
    drop_sites,
    log_event,
    next_sub_run_epoch,
    release_sub_run,
    start_sub_run,
)
from .types import (
    STAY,
    Action,
    Book,
    Context,
    Decision,
    Launch,
    PoolView,
    Revoke,
    in_sequence,
    in_turn,
    known,
)


def broadcast_sites(step: Step, ctx: Context) -> tuple[list[str], list[str]]:
    """The sites a broadcast step runs at, and the listed ones left out (unknown here).

    `all` is every site this creator knows now, when it opens the step: a site added
    to the configs later joins the broadcasts opened after it, and a job that waited
    for its turn runs where the sites are then, not where they were at submission.
    """
    if step["target"] == ALL:
        return sorted((ctx.known_sites or frozenset()) | {ctx.site}), []
    wanted = targets(step)
    return ([site for site in wanted if known_site(site, ctx)],
            [site for site in wanted if not known_site(site, ctx)])


def known_site(site: str, ctx: Context) -> bool:
    return site != ANY and known(site, ctx)


def open_broadcast(doc: Job, step: Step, ctx: Context, pool: PoolView) -> Decision:
    """The creator names the step's sites, and starts its own part if it has a worker."""
    sites, left_out = broadcast_sites(step, ctx)
    detail = "at " + ", ".join(sites)
    if left_out:
        detail += "; not known sites, left out: " + ", ".join(left_out)

    def edit(new: Job) -> None:
        opened = current_step(new)
        opened.update({"runs": {site: new_sub_run() for site in sites},
                       "step_status": "running", "start_time": ctx.now})
        log_event(new, "opened", ctx, detail=detail)

    opening = Decision(Action.OPEN, edit, detail=detail)
    worker = pool.worker_for((doc["_id"], doc["step"]))
    if ctx.site not in sites or worker is None:
        return opening
    return in_turn(opening, start_sub_run_decision(doc, ctx, worker))


def on_own_sub_run(doc: Job, step: Step, ctx: Context, pool: PoolView) -> Decision:
    """A target site starts its own sub-run on sight: nobody competes for it, so no claim
    and no winner; a sub-run the documents say we run, with no worker behind it (a
    restart), is released in a new epoch and started again."""
    key = (doc["_id"], doc["step"])
    run = counting_runs(step).get(ctx.site)
    if run is None:
        return STAY
    if run.get("status") is None:
        worker = pool.worker_for(key)
        if worker is None:
            return STAY  # a free worker's scan (the claimable view) brings it back
        return start_sub_run_decision(doc, ctx, worker)
    if run.get("status") == "running" and key not in pool.running:
        return Decision(Action.RELEASE,
                        release_sub_run(ctx, ctx.site, "worker lost (site restarted)"))
    return STAY


def start_sub_run_decision(doc: Job, ctx: Context, worker: str) -> Decision:
    key = (doc["_id"], doc["step"])
    return Decision(Action.START, start_sub_run(ctx, worker), before=(Book(key, worker),),
                    after=(Launch(key, next_sub_run_epoch(doc, ctx.site), worker),))


def drop_unknown_parts(step: Step, ctx: Context) -> Decision | None:
    """The creator drops the part of a site no configuration of ours names (a document
    written around the rules, or a creator adopted by a site with fewer sites): it could
    never run. As it leaves such a site out when it opens the step."""
    unknown = [site for site in counting_runs(step) if not known_site(site, ctx)]
    if not unknown:
        return None
    return Decision(Action.DROP, drop_sites(ctx, unknown, "not a known site"),
                    detail=f"not known sites: {', '.join(unknown)}")


def revoke_expired_parts(doc: Job, step: Step, ctx: Context) -> Decision:
    """The creator gives back the parts whose site stopped renewing its lease."""
    expired = [site for site, run in sorted(counting_runs(step).items())
               if site != ctx.site and run.get("status") == "running" and ctx.lease_expired(run)]
    if not expired:
        return STAY
    key = (doc["_id"], doc["step"])
    reasons = [f"lease of {site} expired at {sub_runs(step)[site]['lease_until']}"
               for site in expired]
    edit = in_sequence(*(release_sub_run(ctx, site, reason)
                         for site, reason in zip(expired, reasons, strict=True)))
    return Decision(Action.REVOKE, edit, before=tuple(Revoke(key, site) for site in expired),
                    detail="; ".join(reasons))


def broadcast_end(step: Step) -> tuple[bool, str] | None:
    """Whether the step ended by its policy (ok, why); None while it must wait.

    `all` (the default): every site must succeed, and the step fails as soon as one
    site's run failed (after its own retries and alt_do). `any`: the step waits for
    every site and succeeds if one did. Dropped sites count neither way.
    """
    runs = counting_runs(step)
    failed = sorted(site for site, run in runs.items() if run.get("status") == "failed")
    finished = sorted(site for site, run in runs.items() if run.get("status") == "finished")
    if each_policy(step) == "all":
        if failed:
            return False, f"failed at {', '.join(failed)} (each_policy all)"
        if len(finished) == len(runs):
            return True, f"finished at every site ({len(runs)})"
        return None
    if len(failed) + len(finished) < len(runs):
        return None
    if finished:
        return True, f"finished at {len(finished)} of {len(runs)} sites (each_policy any)"
    return False, f"failed at every site ({len(runs)}, each_policy any)"


def drop_problem(doc: Job, ctx: Context, site: str) -> str | None:
    """Why `site` cannot be dropped from the job's current step here (None: it can)."""
    if not is_live(doc):
        return f"the job already ended: {doc['job_status'] or 'every step done'}"
    if ctx.site != doc["creator"]:
        return f"only the job's creator drops sites: run this at {doc['creator']} (--site)"
    index, step = doc["step"], current_step(doc)
    if not is_broadcast(step):
        return f"step {index} is not a broadcast step"
    if step.get("runs") is None:
        return f"step {index} is not open yet: its creator has not named its sites"
    if site not in sub_runs(step):
        return f"{site} is not one of step {index}'s sites ({', '.join(sub_runs(step))})"
    if site in dropped_sites(step):
        return f"{site} was dropped from step {index} already"
    status = sub_runs(step)[site].get("status")
    if status in ("finished", "failed"):
        return f"{site}'s run of step {index} already {status}"
    return None
