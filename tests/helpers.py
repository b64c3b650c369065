"""Small helpers the test modules share."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

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
