"""Small helpers the test modules share."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from jobdist.daemon import Daemon

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


@contextlib.contextmanager
def daemon_with_admin(root: Path, site: str, workers: int, token: str | None) -> Iterator[Daemon]:
    """One site in this process: a real pouchdb-server and its daemon, the admin endpoint
    on a free port; both stopped afterwards."""
    from jobdist.config import SiteConfig
    from jobdist.daemon import Daemon
    from jobdist.lab.localserver import LocalServer, free_port

    server = LocalServer(free_port(), root / "couch", in_memory=True)
    server.start()
    daemon: Daemon | None = None
    thread: threading.Thread | None = None
    try:
        config = SiteConfig(name=site, couch_url=server.url, workers=workers, peers=(),
                            keepalive_period=5.0, shutdown_grace=0.5,
                            admin_port=0, admin_token=token, journal=root / "journal")
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
