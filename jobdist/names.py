"""The known name nearest to a mistyped one, for "did you mean ...?" hints.

One rule for site configs and job documents alike. couch_design/jobdist/
validate_doc_update.js holds the same rule (`nearestName`) so that CouchDB and
`jobdist validate` suggest the same field: change both together
(tests/test_validation.py compares them). Hence a rule simple enough to write
twice exactly, not difflib, and lengths in UTF-16 code units as JavaScript
counts them.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_EDITS = 2


def nearest_name(name: str, known: Iterable[str]) -> str | None:
    """The known name fewest edits away from `name`: at most MAX_EDITS, and fewer
    edits than `name` has characters (`x` is no typo of `do`); the earliest in
    `known` on a tie. An edit inserts, deletes or replaces one character, or swaps
    two adjacent ones (optimal string alignment distance)."""
    typed = utf16_units(name)
    nearest, fewest = None, MAX_EDITS + 1
    for candidate in known:
        units = utf16_units(candidate)
        # The distance is at least the difference in length: skip the long computation.
        if abs(len(units) - len(typed)) >= fewest:
            continue
        edits = edit_distance(typed, units)
        if edits < fewest and edits < len(typed):
            nearest, fewest = candidate, edits
    return nearest


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """` (did you mean 'NAME'?)` for the nearest known name, or "" when none is near."""
    nearest = nearest_name(name, known)
    return "" if nearest is None else f" (did you mean '{nearest}'?)"


def utf16_units(text: str) -> list[bytes]:
    data = text.encode("utf-16-le", "surrogatepass")
    return [data[index:index + 2] for index in range(0, len(data), 2)]


def edit_distance(a: list[bytes], b: list[bytes]) -> int:
    """Optimal string alignment distance: the rows of the classic table, a row per unit of a."""
    rows = [list(range(len(b) + 1))]
    for i in range(1, len(a) + 1):
        row = [i]
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            distance = min(rows[i - 1][j] + 1, row[j - 1] + 1, rows[i - 1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                distance = min(distance, rows[i - 2][j - 2] + 1)
            row.append(distance)
        rows.append(row)
    return rows[len(a)][len(b)]
