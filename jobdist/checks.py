"""The vocabulary the document rules are written in.

A `Check` appends "<path>: <reason>" to a list for what is wrong with one value;
`must_be`, `choice`, `text`, `object_of` and `list_of` build checks, and a `Shape`
checks an object's fields in order, accepting no others.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .javascript_json import is_number, text_length
from .names import did_you_mean

# "Did you mean" hints only while fewer errors than this are found: finding the nearest
# name costs work, and a document may hold 100,000 unknown fields.
MAX_HINTED_ERRORS = 20


def is_object(value: Any) -> bool:
    return isinstance(value, dict)


def is_list(value: Any) -> bool:
    return isinstance(value, list)


def is_string(value: Any) -> bool:
    return isinstance(value, str)


Check = Callable[[Any, str, list[str]], None]


@dataclass(frozen=True)
class Field:
    name: str
    check: Check
    optional: bool = False  # may be left out with no default (a field with one always may)


def must_be(test: Callable[[Any], bool], what: str, *, allow_null: bool = False) -> Check:
    """The value passes `test` (or is null, when allowed); else "must be [null or ]<what>"."""
    reason = ("must be null or " if allow_null else "must be ") + what

    def check(value: Any, path: str, errors: list[str]) -> None:
        if not ((allow_null and value is None) or test(value)):
            errors.append(f"{path}: {reason}")

    return check


def choice(choices: tuple[Any, ...]) -> Check:
    # Compared by type too: in JavaScript `0 === false` is false, in Python `0 == False`.
    return must_be(lambda value: any(type(value) is type(c) and value == c for c in choices),
                   "one of " + ", ".join(json.dumps(c) for c in choices))


def optional_number(comparison: str, bound: int) -> Check:
    """null, or a number `comparison` bound (">" or ">=")."""
    compare = operator.gt if comparison == ">" else operator.ge
    return must_be(lambda value: is_number(value) and compare(value, bound),
                   f"a number {comparison} {bound}", allow_null=True)


def text(max_length: int, *, non_empty: bool, allow_null: bool = False) -> Check:
    kind = "a non-empty string" if non_empty else "a string"
    reason = ("must be null or " if allow_null else "must be ") + kind

    def check(value: Any, path: str, errors: list[str]) -> None:
        if allow_null and value is None:
            return
        if not is_string(value) or (non_empty and value == ""):
            errors.append(f"{path}: {reason}")
        elif text_length(value) > max_length:
            errors.append(f"{path}: must be at most {max_length} characters long")

    return check


class Shape:
    """An object's fields, in order, with what checking it needs worked out once."""

    def __init__(self, fields: list[Field], defaults: dict[str, Any]) -> None:
        self.fields = fields
        self.names = [field.name for field in fields]  # in order: "did you mean" ties
        self.known = frozenset(self.names)
        self.required = frozenset(field.name for field in fields
                                  if not field.optional and field.name not in defaults)

    def check(self, obj: dict[str, Any], prefix: str, errors: list[str]) -> None:
        """Check each field in order; one with a default may be left out; an object
        accepts no other fields."""
        for field in self.fields:
            if field.name in obj:
                field.check(obj[field.name], prefix + field.name, errors)
            elif field.name in self.required:
                errors.append(f"{prefix}{field.name}: is missing")
        unknown = [key for key in obj if key not in self.known]
        for name in sorted_like_javascript(unknown) if unknown else ():
            hint = did_you_mean(name, self.names) if len(errors) < MAX_HINTED_ERRORS else ""
            errors.append(f"{prefix}{name}: unknown field{hint}")


def sorted_like_javascript(names: Any) -> list[str]:
    """Sorted as JavaScript's default sort does: by UTF-16 code units."""
    return sorted(names, key=lambda name: name.encode("utf-16-be", "surrogatepass"))


def object_of(fields: list[Field], reason: str, defaults: dict[str, Any] | None = None, *,
              allow_null: bool = False) -> Check:
    shape = Shape(fields, defaults or {})

    def check(value: Any, path: str, errors: list[str]) -> None:
        if allow_null and value is None:
            return
        if not is_object(value):
            errors.append(f"{path}: {reason}")
            return
        shape.check(value, path + ".", errors)

    return check


def list_of(item_check: Check) -> Check:
    def check(value: Any, path: str, errors: list[str]) -> None:
        if not is_list(value):
            errors.append(f"{path}: must be a list")
            return
        for index, item in enumerate(value):
            item_check(item, f"{path}[{index}]", errors)

    return check


def unchecked(value: Any, path: str, errors: list[str]) -> None:
    """A field that is known, and checked elsewhere or not at all."""
