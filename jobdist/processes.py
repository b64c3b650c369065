"""Process groups: how the workers (a step's shell and all it started) and the lab
(a local CouchDB server) are signalled and watched as one."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path


def live_processes() -> Iterator[tuple[Path, int]]:
    """Each process's /proc directory and process group, zombies left out: orphans
    re-parented to an init that never reaps (common in containers) stay zombies."""
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        if fields[0] not in ("Z", "X"):
            yield stat_file.parent, int(fields[2])


def group_has_live_members(pgid: int) -> bool:
    """Whether any non-zombie process is still in the group."""
    try:  # the common case, asked of the kernel: an empty group (every step's end asks)
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a member we may not signal: it is there
    if not Path("/proc").is_dir():  # not Linux: the kernel's answer, zombies included
        return True
    return any(group == pgid for _, group in live_processes())


def signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is already empty
        os.killpg(pgid, signum)
