"""Process groups: how the workers (a step's shell and all it started) and the lab
(a local CouchDB server) are signalled and watched as one."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def group_has_live_members(pgid: int) -> bool:
    """Whether any non-zombie process is still in the group.

    Zombies are skipped because orphans re-parented to an init that never reaps
    (common in containers) would otherwise make every group look alive forever.
    """
    try:  # the common case, asked of the kernel: an empty group (every step's end asks)
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a member we may not signal: it is there
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: the kernel's answer, zombies included
        return True
    for stat_file in proc.glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            return True
    return False


def signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is already empty
        os.killpg(pgid, signum)
