"""A thread that does one pass of work again and again until the daemon stops:
the keep-alive re-saver, retention and the changes-feed listener are each one.

A pass that fails is logged (a CouchDB error as a one-line warning, anything
else with its traceback) and the thread goes on: a dead re-saver would forget
jobs without a word, and a dead listener would stall the site.
"""

from __future__ import annotations

import threading
from typing import Any

from .couch import CouchError
from .logs import EventLog


class Periodic(threading.Thread):
    """Runs `pass_once` after waiting `wait_before_pass()` seconds, until `stop` is set."""

    what = "pass"  # how the log names a pass, e.g. "keep-alive pass"
    # Failures logged in one line, without a traceback: CouchDB's errors say all there
    # is to say (and a RecursionError's traceback would be a thousand frames).
    expected_errors: tuple[type[Exception], ...] = (CouchError,)

    def __init__(self, name: str, site: str, stop: threading.Event, logger: str) -> None:
        super().__init__(name=f"{name}-{site}", daemon=True)
        self.site = site
        self.stop_event = stop
        self.log = EventLog(logger, site=site)

    def run(self) -> None:
        while not self.stop_event.wait(self.wait_before_pass()):
            try:
                self.pass_once()
            except self.expected_errors as error:
                self.log.warning(f"{self.what} failed", **self.where(),
                                 error=str(error) or type(error).__name__)
            except Exception:  # the thread must outlive any one pass
                self.log.exception(f"{self.what} failed", **self.where())

    def wait_before_pass(self) -> float:
        """Seconds to wait before the next pass: read anew each time, so a period
        changed at run time (the admin endpoint) applies from the next pass."""
        raise NotImplementedError

    def where(self) -> dict[str, Any]:
        """More fields for a failure's log line, e.g. the feed's position."""
        return {}

    def pass_once(self) -> object:
        raise NotImplementedError
