"""The JSON text of a value as JavaScript writes it, and its strings' lengths.

CouchDB's validate_doc_update measures documents in JavaScript: a string's length
counts UTF-16 code units, `JSON.stringify` escapes lone surrogates, and numbers are
spelled as Number::toString spells them. jobdist/validation.py measures alike.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

# In a str decoded from JSON, every surrogate code point is a lone one.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def text_length(text: str) -> int:
    """The length JavaScript reports: UTF-16 code units."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def is_number(value: Any) -> bool:
    """A JSON number JavaScript holds as one: finite, and not a bool."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond the float range: Infinity in JavaScript
        return False


def python_json(value: Any) -> str | None:
    """json.dumps' compact text, or None: not JSON, or nested past C's stack."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return None


def javascript_length(text: str) -> int:
    """The length of `text` (Python's JSON) as JavaScript would write the same value."""
    total = len(text) if text.isascii() else (
        text_length(text) + 5 * len(LONE_SURROGATE.findall(text)))
    if MAYBE_RESPELLED.search(text):  # rare: tokenise to skip what is inside strings
        for token in PYTHON_NUMBER.findall(text):
            if token and not SAME_SPELLING.fullmatch(token):
                total += len(javascript_number(float(token))) - len(token)
    return total


# A number JavaScript may spell otherwise, or text inside a string that looks like one.
MAYBE_RESPELLED = re.compile(
    r"(?:^|[:,\[])(?:-?\d+[.eE][\d.eE+-]*|-?\d{16,}|-?Infinity|NaN)(?=[,\]}]|$)")
# A JSON string (skipped) or a number token as Python writes it.
PYTHON_NUMBER = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|(-?(?:\d[\d.eE+-]*|Infinity)|NaN)')
# An integer JavaScript holds exactly (below 2**53) is spelled alike in both.
SAME_SPELLING = re.compile(r"-?\d{1,15}")


def walked_json_length(value: Any) -> int:
    # Iterative: a deeply nested unknown field must not exhaust Python's stack.
    total = 0
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            # Braces, a colon per member and the commas between members.
            total += 2 + len(item) + max(len(item) - 1, 0)
            total += sum(scalar_length(str(key)) for key in item)
            pending.extend(item.values())
        elif isinstance(item, list):
            total += 2 + max(len(item) - 1, 0)
            pending.extend(item)
        else:
            total += scalar_length(item)
    return total


def scalar_length(value: Any) -> int:
    if value is None or isinstance(value, str | int | float):  # (a bool is an int)
        return javascript_length(json.dumps(value, ensure_ascii=False))
    return 4  # what JSON.stringify turns into null


def javascript_number(number: float) -> str:
    """A number as JSON.stringify writes it: Number::toString (ECMA-262), null if not finite."""
    if not math.isfinite(number):
        return "null"
    if number == 0:
        return "0"
    sign = "-" if number < 0 else ""
    shortest = Decimal(repr(abs(number))).normalize()  # repr: the shortest round trip
    digits = "".join(map(str, shortest.as_tuple().digits))
    point = len(digits) + int(shortest.as_tuple().exponent)
    if len(digits) <= point <= 21:
        return sign + digits + "0" * (point - len(digits))
    if 0 < point <= 21:
        return sign + digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return sign + "0." + "0" * -point + digits
    exponent = point - 1
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{mantissa}e{'+' if exponent >= 0 else '-'}{abs(exponent)}"
