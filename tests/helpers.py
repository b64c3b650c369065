"""Small helpers the test modules share."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from jobdist.config import SiteConfig
    from jobdist.couch import Database
    from jobdist.daemon import Daemon
    from jobdist.model import Doc

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float = 20.0, what: str = "the condition",
             interval: float = 0.05) -> T:
    """The first truthy value of `condition()`; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not in time ({timeout} s): {what}")
        time.sleep(interval)


README = Path(__file__).resolve().parent.parent / "README.md"
SH_BLOCK = re.compile(r"```sh\n(.*?)```", re.DOTALL)


def readme_http_submission() -> tuple[str, dict[str, Any]]:
    """The README's shell block that submits a job with curl, and the job it writes."""
    for block in SH_BLOCK.findall(README.read_text(encoding="utf-8")):
        found = re.search(r"^curl .* -d '(\{.*?\})'$", block, re.DOTALL | re.MULTILINE)
        if found:
            return block, json.loads(found.group(1))
    raise AssertionError("README.md shows no curl submission")


def in_tmp(config: SiteConfig, directory: Path) -> SiteConfig:
    """The site with its journal, and so its steps' progress files, under `directory`:
    the default is relative to the working directory, the checkout under pytest."""
    return replace(config, daemon=replace(config.daemon, journal=directory))


@contextlib.contextmanager
def daemon_with_admin(root: Path, site: str, workers: int, token: str | None) -> Iterator[Daemon]:
    """One site in this process: a real pouchdb-server and its daemon, the admin endpoint
    on a free port; both stopped afterwards."""
    from jobdist.config import (
        AdminSettings,
        CouchSettings,
        DaemonSettings,
        SiteConfig,
    )
    from jobdist.daemon import Daemon
    from jobdist.lab.localserver import LocalServer, free_port

    server = LocalServer(free_port(), root / "couch", in_memory=True)
    server.start()
    daemon: Daemon | None = None
    thread: threading.Thread | None = None
    try:
        config = SiteConfig(name=site, couch=CouchSettings(server.url), workers=workers,
                            peers=(),
                            daemon=DaemonSettings(shutdown_grace=0.5, journal=root / "journal"),
                            admin=AdminSettings(port=0, token=token))
        daemon = Daemon(config)
        ready = root / "ready"
        thread = threading.Thread(target=daemon.run, args=(ready,), daemon=True)
        thread.start()
        wait_for(ready.exists)
        assert daemon.admin is not None
        yield daemon
    finally:
        if daemon is not None:
            daemon.stop()
        if thread is not None:
            thread.join(30)
        server.stop()


def write_conflict(db: Database, leaves: list[Doc]) -> None:
    """Store these revisions as replication does (`new_edits: false`): conflicting leaves."""
    body = {"new_edits": False, "docs": leaves}
    db.couch.call("write conflicting leaves", db.couch.client.post_bulk_docs, db.name, body)


def conflicting_leaves() -> tuple[Doc, Doc]:
    """Two revisions of one job, open and done: CouchDB's winner is the open one, the
    merge is the done one. Created at a site with no daemon, for a site nobody runs:
    nobody resolves the conflict."""
    from jobdist.model import new_job, new_step

    open_leaf = new_job("archive", [new_step("echo merged", target="nowhere")])
    done_leaf = copy.deepcopy(open_leaf)
    done_leaf["job"][0].update(step_status="finished", claimed_by="nowhere", winner="nowhere",
                               epoch=1, exit_code=0, executioner="nowhere/w0")
    done_leaf.update(step=1, job_status="success", updated_at=open_leaf["created_at"])
    done_leaf["history"].append({**done_leaf["history"][0], "event": "finished",
                                 "site": "nowhere"})
    open_leaf["_rev"], done_leaf["_rev"] = "1-" + "f" * 32, "1-" + "a" * 32
    return open_leaf, done_leaf
