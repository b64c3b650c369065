"""Small helpers the test modules share."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

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
