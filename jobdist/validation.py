"""The job document's rules (docs/job-document.md), checked in Python.

couch_design/jobdist/validate_doc_update.js holds the same rules, in the same
order and with the same messages, so that a document refused by CouchDB gets
the very reason `format_errors(validate_job(doc))` gives here. Change both
files together: tests/test_validation.py compares them on a corpus.

Parity with JavaScript shapes a few choices:
- an integer is any JSON number with an integral value (JavaScript cannot tell
  `1.0` from `1`), but never a bool;
- lengths count UTF-16 code units, as JavaScript's `.length` does;
- the size limit measures the text `JSON.stringify` would produce.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import date
from typing import Any

from .checks import (
    Check,
    Field,
    Shape,
    choice,
    is_list,
    is_object,
    is_string,
    list_of,
    must_be,
    object_of,
    optional_number,
    sorted_like_javascript,
    text,
    unchecked,
)
from .javascript_json import (
    LONE_SURROGATE,
    is_number,
    javascript_length,
    python_json,
    text_length,
    walked_json_length,
)
from .model import (
    AFTER_POLICIES,
    ALL,
    ANY,
    EACH_POLICIES,
    EVENT_DEFAULTS,
    EVENT_REASONS,
    FINAL_STATUSES,
    HISTORY_EVENTS,
    JOB_DEFAULTS,
    JOB_FORMAT,
    MAX_AFTER,
    RETRY_DEFAULTS,
    RUN_STATUSES,
    STEP_DEFAULTS,
    is_broadcast,
    newer_format,
)

MAX_DOC_SIZE = 1024 * 1024
MAX_DEPTH = 32  # levels of objects and lists; Python's JSON parser gives up near 1000
MAX_STEPS = 1000
MAX_DO_LENGTH = 65536
MAX_STREAM_LENGTH = 4096
MAX_PROGRESS_MESSAGE = 200  # characters of a step's progress message
MAX_ID_LENGTH = 256
# Counts stay far below 2**53: past it, JavaScript cannot add 1 and epochs stop growing.
MAX_COUNT = 1_000_000_000
MAX_RETRIES = 1000

# Revision metadata the server adds to the document it validates: not measured.
UNMEASURED_FIELDS = ("_rev", "_revisions")
# CouchDB's own top-level members (it refuses any other name starting with _), not checked.
COUCHDB_FIELDS = [Field(name, unchecked, optional=True) for name in (
    "_rev", "_revisions", "_conflicts", "_deleted_conflicts", "_deleted", "_attachments",
    "_revs_info", "_local_seq")]

SITE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
ISO_UTC = re.compile(
    r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?Z"
)

SITE_NAME_RULE = (
    "a site name (1-64 characters of a-z, 0-9, _ and -, starting with a letter or digit)"
)
SITE_NAME_REASON = "must be " + SITE_NAME_RULE
ISO_UTC_RULE = "an ISO 8601 UTC time ending in Z (YYYY-MM-DDTHH:MM:SS[.ffffff]Z)"
TARGET_REASON = 'must be "any", a site name or a non-empty list of site names'
CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f]")
ID_RULE = (
    f"a string of 1-{MAX_ID_LENGTH} characters, without control characters "
    "or unpaired surrogates"
)


def format_errors(errors: list[str]) -> str:
    """The errors as one line: exactly the `reason` CouchDB answers with."""
    return "; ".join(errors)


# --- value tests -------------------------------------------------------------


def is_integer(value: Any) -> bool:
    return is_number(value) and float(value).is_integer()


def is_site_name(value: Any) -> bool:
    return is_string(value) and SITE_NAME.fullmatch(value) is not None


def is_iso_utc(value: Any) -> bool:
    return is_string(value) and ISO_UTC.fullmatch(value) is not None and is_calendar_day(value)


def is_calendar_day(text: str) -> bool:
    """A day that exists (no February 30) in a year >= 1 (what datetime can represent)."""
    try:
        date(int(text[0:4]), int(text[5:7]), int(text[8:10]))
    except ValueError:
        return False
    return True


def is_doc_id(value: Any) -> bool:
    """An id a daemon can put in a URL and a step's environment."""
    return (
        is_string(value)
        and 1 <= text_length(value) <= MAX_ID_LENGTH
        and CONTROL_CHARACTER.search(value) is None
        and LONE_SURROGATE.search(value) is None
    )


def integer_between(low: int, high: int) -> Check:
    return must_be(lambda value: is_integer(value) and low <= value <= high,
                   f"an integer between {low} and {high}")


def check_target(value: Any, path: str, errors: list[str]) -> None:
    if is_site_name(value):  # "any" is one too
        return
    if not is_list(value):
        errors.append(f"{path}: {TARGET_REASON}")
        return
    if not value:
        errors.append(f"{path}: must not be an empty list")
        return
    check_each_once(value, path, errors, is_site_name, SITE_NAME_REASON, "site name")


def check_each_once(items: list[Any], path: str, errors: list[str], valid: Callable[[Any], bool],
                    reason: str, kind: str, own: Any = None) -> None:
    """Each item valid, not `own` (the document's own name), and listed once."""
    seen: set[str] = set()
    for index, item in enumerate(items):
        if not valid(item):
            errors.append(f"{path}[{index}]: {reason}")
        elif own is not None and item == own:
            errors.append(f"{path}[{index}]: must not be the job's own id")
        elif item in seen:
            errors.append(f"{path}[{index}]: duplicate {kind}")
        else:
            seen.add(item)


def check_steps(value: Any, path: str, errors: list[str]) -> None:
    if not is_list(value) or not value:
        errors.append(f"{path}: must be a non-empty list of steps")
        return
    if len(value) > MAX_STEPS:
        errors.append(f"{path}: must have at most {MAX_STEPS} steps")
    for index, step in enumerate(value):
        STEP(step, f"{path}[{index}]", errors)
        if is_object(step):
            check_broadcast(step, f"{path}[{index}]", errors)


def step_index(step_count: int | None) -> Check:
    """`step` indexes `job`, or equals its length once every step is done."""

    def check(value: Any, path: str, errors: list[str]) -> None:
        if not is_integer(value):
            errors.append(f"{path}: must be an integer")
        elif step_count is not None and not 0 <= value <= step_count:
            errors.append(f"{path}: must be between 0 and {step_count} (the number of steps)")

    return check


# --- the document ------------------------------------------------------------

SITE = must_be(is_site_name, SITE_NAME_RULE)
OPTIONAL_SITE = must_be(is_site_name, SITE_NAME_RULE, allow_null=True)
TIME = must_be(is_iso_utc, ISO_UTC_RULE)
OPTIONAL_TIME = must_be(is_iso_utc, ISO_UTC_RULE, allow_null=True)
OPTIONAL_STRING = must_be(is_string, "a string", allow_null=True)
COUNT = integer_between(0, MAX_COUNT)
NAME = must_be(is_site_name, SITE_NAME_RULE.replace("a site name", "a name"))
FLAG = must_be(lambda value: isinstance(value, bool), "true or false")
# The tick a schedule created the job for (jobdist/schedules.py).
TICK = object_of([Field("name", NAME), Field("tick", TIME)],
                 "must be an object {name, tick}")

RETRY_STRATEGY_FIELDS = [
    Field("max_retries", integer_between(0, MAX_RETRIES)),
    Field("max_time", optional_number(">", 0)),
    Field("sleep", optional_number(">=", 0)),
    Field("sleep_factor", optional_number(">=", 1)),
    Field("sleep_max", optional_number(">=", 0)),
]

OUTPUT_FIELDS = [
    Field("stdout", text(MAX_STREAM_LENGTH, non_empty=False)),
    Field("stderr", text(MAX_STREAM_LENGTH, non_empty=False)),
]

PROGRESS_FIELDS = [
    Field("fraction", must_be(lambda value: is_number(value) and 0 <= value <= 1,
                              "a number between 0 and 1")),
    Field("message", text(MAX_PROGRESS_MESSAGE, non_empty=False)),
    Field("at", TIME),
]

# --- broadcast steps (docs/job-document.md, "Broadcast steps") ---
MAX_RUN_SITES = 1000
BROADCAST_REASON = 'only for a broadcast step (target "all", or a list of sites with each: true)'
# What an execution records, on its step or on its sub-run.
EXECUTION_FIELDS = [
    Field("exec_time", optional_number(">=", 0)),
    Field("start_time", OPTIONAL_TIME),
    Field("finish_time", OPTIONAL_TIME),
    Field("lease_until", OPTIONAL_TIME),
    Field("attempts", COUNT),
    Field("exit_code", must_be(is_integer, "an integer", allow_null=True)),
    Field("output", object_of(OUTPUT_FIELDS, "must be null or an object {stdout, stderr}",
                              allow_null=True)),
    Field("progress", object_of(PROGRESS_FIELDS,
                                "must be null or an object {fraction, message, at}",
                                allow_null=True)),
]
SUB_RUN = object_of([Field("epoch", COUNT), Field("status", choice(RUN_STATUSES)),
                     Field("executioner", OPTIONAL_STRING), *EXECUTION_FIELDS],
                    "must be an object")


def check_runs(value: Any, path: str, errors: list[str]) -> None:
    """null until the creator opens the step; then one sub-run per site, by site name."""
    if value is None:
        return
    if not is_object(value):
        errors.append(f"{path}: must be null or an object of sub-runs by site name")
        return
    if len(value) > MAX_RUN_SITES:
        errors.append(f"{path}: must have at most {MAX_RUN_SITES} sites")
    for site in sorted_like_javascript(value):
        if not is_site_name(site):
            errors.append(f"{path}.{site}: {SITE_NAME_REASON}")
        else:
            SUB_RUN(value[site], f"{path}.{site}", errors)


EACH_ANY_REASON = 'the target names no site ("any" names none): list the sites, or use "all"'


def check_broadcast(step: dict[str, Any], path: str, errors: list[str]) -> None:
    """The broadcast fields agree with the target and with each other."""
    target = step.get("target")
    if step.get("each") is True and not is_list(target) and target != ALL:
        errors.append(f'{path}.each: may be true only when target is a list of sites or "all"')
    if step.get("each") is True and is_list(target) and target and \
            all(site == ANY for site in target):
        errors.append(f"{path}.each: {EACH_ANY_REASON}")
    broadcast = is_broadcast(step)
    runs: Any = step.get("runs")
    for name in ("each_policy", "runs", "dropped"):
        if not broadcast and step.get(name) is not None:
            errors.append(f"{path}.{name}: {BROADCAST_REASON}")
    if broadcast and step.get("step_status") == "running" and runs is None:
        errors.append(f"{path}.runs: must name the step's sites once it runs")
    dropped: Any = step.get("dropped")
    if broadcast and is_list(dropped):
        for index, site in enumerate(dropped):
            if is_site_name(site) and (not is_object(runs) or site not in runs):
                errors.append(f"{path}.dropped[{index}]: not one of the step's sites (runs)")


# Submitter fields first, then the runtime fields, then a broadcast step's. Only `do`
# has no default. check_steps checks a step's broadcast fields agree, after these.
STEP = object_of([
    Field("target", check_target),
    Field("do", text(MAX_DO_LENGTH, non_empty=True)),
    Field("alt_do", text(MAX_DO_LENGTH, non_empty=True, allow_null=True)),
    Field("timeout", optional_number(">", 0)),
    Field("retry_strategy",
          object_of(RETRY_STRATEGY_FIELDS, "must be an object", RETRY_DEFAULTS)),
    Field("epoch", COUNT),
    Field("claimed_by", OPTIONAL_SITE),
    Field("winner", OPTIONAL_SITE),
    Field("executioner", OPTIONAL_STRING),
    Field("step_status", choice(RUN_STATUSES)),
    *EXECUTION_FIELDS,
    Field("each", FLAG, optional=True),
    Field("each_policy", choice(EACH_POLICIES), optional=True),
    Field("runs", check_runs, optional=True),
    Field("dropped", list_of(SITE), optional=True),
], "must be an object", STEP_DEFAULTS)

EVENT = object_of([
    Field("event", choice(HISTORY_EVENTS)),
    Field("step", COUNT),
    Field("site", SITE),
    Field("worker", OPTIONAL_STRING),
    Field("epoch", COUNT),
    Field("at", TIME),
    Field("detail", OPTIONAL_STRING),
    Field("reason", choice(EVENT_REASONS), optional=True),
], "must be an object", EVENT_DEFAULTS)


def check_after(own_id: Any) -> Check:
    """`after`: the ids of other jobs, each once, at most MAX_AFTER of them."""
    def check(value: Any, path: str, errors: list[str]) -> None:
        if not is_list(value) or len(value) > MAX_AFTER:
            errors.append(f"{path}: must be a list of at most {MAX_AFTER} job ids")
            return
        check_each_once(value, path, errors, is_doc_id, "must be " + ID_RULE, "job id", own_id)

    return check


# Top-level fields: the job's, then the user's `meta`, then CouchDB's; no others. Their
# order breaks ties between "did you mean" hints: the job's own come first.
JOB_FIELDS = [
    Field("_id", must_be(is_doc_id, ID_RULE), optional=True),
    Field("type", unchecked),  # checked first, by validate_job
    Field("creator", SITE),
    Field("priority", must_be(is_integer, "an integer")),
    Field("created_at", OPTIONAL_TIME),  # null (the default) until the creator accepts
    Field("updated_at", OPTIONAL_TIME),
    Field("step", unchecked),  # job_fields gives its check, which needs the step count
    Field("job_status", choice((None, *FINAL_STATUSES))),
    Field("job", check_steps),
    Field("history", list_of(EVENT)),
    Field("keepalive_at", TIME, optional=True),
    Field("meta", must_be(is_object, "an object"), optional=True),
    Field("schedule", TICK, optional=True),
    # Waiting (docs/job-document.md, "Waiting"): absent means none.
    Field("after", unchecked, optional=True),  # as `step`: its check needs the job's id
    Field("after_policy", choice(AFTER_POLICIES), optional=True),
    Field("not_before", OPTIONAL_TIME, optional=True),
    Field("format", integer_between(1, JOB_FORMAT), optional=True),
    *COUCHDB_FIELDS,
]


def job_fields(step_count: int | None, own_id: Any) -> list[Field]:
    """JOB_FIELDS with the checks of `step` and `after`, which depend on the document;
    the others are built once."""
    per_document = {"step": step_index(step_count), "after": check_after(own_id)}
    return [Field(field.name, per_document[field.name], field.optional)
            if field.name in per_document else field for field in JOB_FIELDS]


EMPTY_DOCUMENT = ("document: empty: was the body sent as JSON? (Content-Type: "
                  "application/json)")


def validate_job(doc: Any) -> list[str]:
    """Every rule the document breaks, as "<field path>: <reason>"; [] when valid."""
    if not is_object(doc):
        return ["document: must be a JSON object"]
    if doc.get("_deleted") is True or is_design_doc(doc):
        return []
    if all(name.startswith("_") for name in doc):
        # What a server that does not read the body as JSON stores: pouchdb-server takes
        # curl's default form encoding as an empty document (CouchDB answers 415 itself).
        return [EMPTY_DOCUMENT]
    if doc.get("type") != "job":
        return ['type: must be "job"']
    if newer_format(doc):
        return []  # a newer release's rules, which its own sites apply: not ours to judge
    errors: list[str] = []
    # Depth first: measuring the size of a very deep document would overflow JavaScript's stack.
    if too_deep(doc):
        errors.append(f"document: too deeply nested: more than {MAX_DEPTH} levels of objects "
                      "and lists")
    elif json_size_over(doc, MAX_DOC_SIZE):
        errors.append(f"document: too large: its JSON exceeds {MAX_DOC_SIZE} characters (1 MiB)")
    steps = doc.get("job")
    step_count = len(steps) if is_list(steps) and steps else None
    Shape(job_fields(step_count, doc.get("_id")), JOB_DEFAULTS).check(doc, "", errors)
    return errors


def is_design_doc(doc: dict[str, Any]) -> bool:
    return is_string(doc.get("_id")) and doc["_id"].startswith("_design/")


# --- depth and size, measured as JSON.stringify(doc).length --------------------------


def too_deep(doc: dict[str, Any]) -> bool:
    """Does any object or list sit more than MAX_DEPTH levels deep (the document is 1)?"""
    # Level by level, containers only: iterative, so a deep document cannot exhaust the
    # stack, and a document's many scalars cost nothing.
    level = [value for key, value in doc.items()
             if key not in UNMEASURED_FIELDS and isinstance(value, CONTAINERS)]
    depth = 2
    while level:
        if depth > MAX_DEPTH:
            return True
        below: list[Any] = []
        for value in level:
            children = value.values() if isinstance(value, dict) else value
            below += [child for child in children if isinstance(child, CONTAINERS)]
        level, depth = below, depth + 1
    return False


CONTAINERS = (dict, list)  # (a tuple: isinstance takes it faster than `dict | list`)


def json_size(doc: Mapping[str, Any]) -> int:
    """Length of the document's JSON text as JavaScript would write it."""
    return json_length(measured_part(doc))


def json_size_over(doc: Mapping[str, Any], limit: int) -> bool:
    """json_size(doc) > limit, measured exactly only near the limit: JavaScript's text is
    at most JS_GROWTH times as long as Python's (a lone surrogate, 1 character in
    Python's text, is 6 in JavaScript's; a number grows less: 1e+20 is 21 characters)."""
    measured = measured_part(doc)
    text = python_json(measured)
    if text is None:
        return walked_json_length(measured) > limit
    return JS_GROWTH * len(text) > limit and javascript_length(text) > limit


JS_GROWTH = 6


def measured_part(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in doc.items() if key not in UNMEASURED_FIELDS}


def json_length(value: Any) -> int:
    """JSON.stringify(value).length, from one json.dumps in C (measuring a document value
    by value in Python was a fifth of a daemon's CPU): Python writes the same text but
    for lone surrogates, which JavaScript escapes, and some numbers, which it spells
    otherwise (1.0 as 1, 1e-05 as 1e-5, NaN as null)."""
    text = python_json(value)
    return walked_json_length(value) if text is None else javascript_length(text)


# --- submissions ---------------------------------------------------------------

# What the server fills in when it turns a submission into a job (jobdist.model.new_job);
# every other field a submission leaves out has its default (jobdist.model.JOB_DEFAULTS).
SERVER_FILLED: dict[str, Any] = {"type": "job", "creator": "cli"}


def validate_submission(doc: Any) -> list[str]:
    """validate_job on the document as it would be stored: `type` and `creator` filled."""
    return validate_job({**SERVER_FILLED, **doc} if is_object(doc) else doc)
