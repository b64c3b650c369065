"""Bounded memories: what the daemon remembers of jobs and sites, oldest first, the
oldest forgotten past a limit (each limit says what forgetting costs)."""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def remember(memo: dict[K, V], key: K, value: V | None, limit: int) -> None:
    """Keep `value` as the newest entry of `memo` (None: forget the key), forgetting
    the oldest past `limit`."""
    memo.pop(key, None)
    if value is not None:
        memo[key] = value  # re-inserted: the dict stays oldest first
    while len(memo) > limit:
        del memo[next(iter(memo))]
