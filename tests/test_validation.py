"""The job rules in Python, and their twin in CouchDB's validate_doc_update.

The corpus at the end is PUT into a real server: each malformed document must
be refused with exactly the reason the Python side gives.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from typing import Any, NotRequired, get_origin, get_type_hints

import pytest
import requests
from hypothesis import example, given, settings
from hypothesis import strategies as st

from jobdist.design import load_design_docs
from jobdist.document_rules import SCHEDULE_DEFAULTS
from jobdist.javascript_json import walked_json_length
from jobdist.model import (
    EVENT_DEFAULTS,
    JOB_DEFAULTS,
    JOB_FORMAT,
    RETRY_DEFAULTS,
    STEP_DEFAULTS,
    Event,
    Job,
    Reason,
    RetryStrategy,
    Step,
    SubRun,
    new_sub_run,
    newer_format,
    normalise,
)
from jobdist.validation import (
    JS_GROWTH,
    MAX_DOC_SIZE,
    format_errors,
    json_length,
    json_size,
    json_size_over,
    validate_job,
    validate_submission,
)

Doc = dict[str, Any]
T0 = "2026-11-22T00:35:12.123456Z"
T1 = "2026-11-22T00:36:00.000000Z"
SITE_NAME = "a site name (1-64 characters of a-z, 0-9, _ and -, starting with a letter or digit)"
SITE_RULE = "must be " + SITE_NAME
ISO_RULE = "an ISO 8601 UTC time ending in Z (YYYY-MM-DDTHH:MM:SS[.ffffff]Z)"
MISSING = object()  # a `change` value that removes the field
COUNT_RULE = "must be an integer between 0 and 1000000000"
ID_RULE = "must be a string of 1-256 characters, without control characters or unpaired surrogates"


def step(**fields: Any) -> Doc:
    """A complete step, as stored once submitted."""
    return {
        "target": "any",
        "do": "sleep 5",
        "alt_do": None,
        "timeout": 3600,
        "retry_strategy": {
            "max_retries": 3, "max_time": None, "sleep": 1, "sleep_factor": 2, "sleep_max": 10,
        },
        "epoch": 0,
        "claimed_by": None,
        "winner": None,
        "executioner": None,
        "step_status": None,
        "exec_time": None,
        "start_time": None,
        "finish_time": None,
        "attempts": 0,
        "exit_code": None,
        "output": None,
        "progress": None,
        **fields,
    }


def job(**fields: Any) -> Doc:
    """The example job of docs/job-document.md, with one history event."""
    return {
        "_id": "job-20261122T003512.123456Z-3fa9c2d1",
        "type": "job",
        "creator": "global",
        "priority": 0,
        "created_at": T0,
        "updated_at": T0,
        "step": 0,
        "job_status": None,
        "job": [step()],
        "history": [
            {"event": "created", "step": 0, "site": "global", "worker": None, "epoch": 0,
             "at": T0, "detail": None},
        ],
        **fields,
    }


def change(doc: Doc, path: tuple[str | int, ...], value: Any) -> Doc:
    """A copy of doc with the value at path replaced (or removed, for MISSING)."""
    changed = copy.deepcopy(doc)
    parent = changed
    for key in path[:-1]:
        parent = parent[key]
    if value is MISSING:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return changed


# --- documents the rules accept ----------------------------------------------------


def finished_job() -> Doc:
    done = step(
        claimed_by="site-b", winner="site-b", executioner="site-b/w1", step_status="finished",
        exec_time=1.5, start_time=T0, finish_time=T1, attempts=1, exit_code=0, epoch=1,
        output={"stdout": "hi\n", "stderr": ""},
        progress={"fraction": 1, "message": "copied volume 3", "at": T1},
    )
    return job(step=1, job_status="success", job=[done], keepalive_at=T1)


def broadcast_job() -> Doc:
    """A broadcast step opened at three sites: one finished, one running, one dropped."""
    runs = {"a": sub_run(epoch=1, status="finished", executioner="a/w1", start_time=T0,
                         finish_time=T1, exec_time=1.0, attempts=1, exit_code=0,
                         output={"stdout": "", "stderr": ""}),
            "b": sub_run(epoch=2, status="running", executioner="b/w2", start_time=T0,
                         lease_until=T1,
                         progress={"fraction": 0.5, "message": "half", "at": T1}),
            "c": sub_run()}
    return job(job=[step(target="all", each_policy="any", step_status="running",
                         start_time=T0, runs=runs, dropped=["c"]),
                    step(target=["a", "b"], each=True)])


def sub_run(**fields: Any) -> Doc:
    """One site's part of a broadcast step, as the creator opens it."""
    return {"epoch": 0, "status": None, "executioner": None, "start_time": None,
            "finish_time": None, "exec_time": None, "lease_until": None, "attempts": 0,
            "exit_code": None, "output": None, "progress": None, **fields}


def minimal_job() -> Doc:
    """Runtime step fields, alt_do and timeout left out: they take their initial values."""
    return job(job=[{"target": ["a", "b-2", "c_3"], "do": "true", "retry_strategy": {
        "max_retries": 0}}])


# What a user writes over CouchDB's HTTP API (the README's curl example): every other
# field takes its default.
HTTP_JOB: Doc = {"type": "job", "creator": "global", "job": [{"target": "any", "do": "make"}]}


def nested(depth: int) -> Any:
    """A list `depth` levels deep (a value at the top level of a document is at level 2)."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    "doc",
    [
        job(),
        job(_id="j" * 256, meta={"leap": ["2024-02-29T23:59:59Z"], "deep": nested(30)},
            created_at="2024-02-29T00:00:00.123456789Z", updated_at="2024-02-29T00:00:00Z"),
        finished_job(),
        minimal_job(),
        job(priority=-7, meta={"anything": [1, 2], "owner": {"team": "ops"}}),
        job(meta={}),
        job(priority=2.0),  # JavaScript cannot tell 2.0 from 2
        # CouchDB's own members, as a read with every option returns them.
        job(_rev="2-b", _revisions={"start": 2, "ids": ["b", "a"]}, _conflicts=["2-c"],
            _deleted_conflicts=["2-d"], _deleted=False, _attachments={}, _local_seq=7,
            _revs_info=[{"rev": "2-b", "status": "available"}]),
        {"_id": "job-x", "_rev": "1-abc", "_deleted": True},
        {"_id": "_design/other", "views": {}},
        HTTP_JOB,
        normalise(HTTP_JOB),  # every default is itself valid
        {"type": "job", "creator": "global", "job": [{"do": "make", "retry_strategy": {}}],
         "history": [{"event": "created", "step": 0, "site": "global", "at": T0}]},
        job(created_at=None, updated_at=None),
        broadcast_job(),
        job(after=["job-a", "job-b"], after_policy="always", not_before=T1),
        job(after=[], not_before=None, after_policy="success"),
        job(after=[f"job-{n}" for n in range(100)]),
    ],
    ids=["example", "edges", "finished", "minimal", "meta", "meta-empty", "integral-float",
         "couchdb-members", "deleted", "design", "http", "http-normalised", "http-no-target",
         "not-yet-accepted", "broadcast", "waiting", "waiting-none", "waiting-most"],
)
def test_valid_documents_pass(doc: Doc) -> None:
    assert validate_job(doc) == []


# --- one failing case per rule -----------------------------------------------------

CASES: list[tuple[str, tuple[str | int, ...], Any, str]] = [
    ("type", ("type",), "task", 'type: must be "job"'),
    ("creator", ("creator",), "Global", f"creator: {SITE_RULE}"),
    ("creator-long", ("creator",), "a" * 65, f"creator: {SITE_RULE}"),
    ("creator-dash", ("creator",), "-a", f"creator: {SITE_RULE}"),
    ("creator-newline", ("creator",), "a\n", f"creator: {SITE_RULE}"),
    ("priority", ("priority",), "high", "priority: must be an integer"),
    ("priority-float", ("priority",), 1.5, "priority: must be an integer"),
    ("created_at", ("created_at",), "2026-11-22T00:35:12+01:00",
     f"created_at: must be null or {ISO_RULE}"),
    ("updated_at", ("updated_at",), "", f"updated_at: must be null or {ISO_RULE}"),
    ("step-range", ("step",), 2, "step: must be between 0 and 1 (the number of steps)"),
    ("step-negative", ("step",), -1, "step: must be between 0 and 1 (the number of steps)"),
    ("job_status", ("job_status",), "done",
     'job_status: must be one of null, "success", "failed", "cancelled"'),
    ("job-empty", ("job",), [], "job: must be a non-empty list of steps"),
    ("job-many", ("job",), [step()] * 1001, "job: must have at most 1000 steps"),
    ("step-not-object", ("job", 0), "sleep 1", "job[0]: must be an object"),
    ("target", ("job", 0, "target"), 3,
     'job[0].target: must be "any", a site name or a non-empty list of site names'),
    ("target-empty", ("job", 0, "target"), [], "job[0].target: must not be an empty list"),
    ("target-item", ("job", 0, "target"), ["a", "B"], f"job[0].target[1]: {SITE_RULE}"),
    ("target-duplicate", ("job", 0, "target"), ["a", "a"],
     "job[0].target[1]: duplicate site name"),
    ("do", ("job", 0, "do"), "", "job[0].do: must be a non-empty string"),
    ("do-long", ("job", 0, "do"), "x" * 65537, "job[0].do: must be at most 65536 characters long"),
    # Lengths count UTF-16 code units, as JavaScript does: each emoji is 2.
    ("do-long-utf16", ("job", 0, "do"), "\U0001f600" * 32769,
     "job[0].do: must be at most 65536 characters long"),
    ("alt_do", ("job", 0, "alt_do"), "", "job[0].alt_do: must be null or a non-empty string"),
    ("timeout", ("job", 0, "timeout"), 0, "job[0].timeout: must be null or a number > 0"),
    ("retry-null", ("job", 0, "retry_strategy"), None, "job[0].retry_strategy: must be an object"),
    ("retry-type", ("job", 0, "retry_strategy"), [], "job[0].retry_strategy: must be an object"),
    ("max_retries", ("job", 0, "retry_strategy", "max_retries"), None,
     "job[0].retry_strategy.max_retries: must be an integer between 0 and 1000"),
    ("max_time", ("job", 0, "retry_strategy", "max_time"), 0,
     "job[0].retry_strategy.max_time: must be null or a number > 0"),
    ("sleep", ("job", 0, "retry_strategy", "sleep"), -1,
     "job[0].retry_strategy.sleep: must be null or a number >= 0"),
    ("sleep_factor", ("job", 0, "retry_strategy", "sleep_factor"), 0.5,
     "job[0].retry_strategy.sleep_factor: must be null or a number >= 1"),
    ("sleep_max", ("job", 0, "retry_strategy", "sleep_max"), "10",
     "job[0].retry_strategy.sleep_max: must be null or a number >= 0"),
    ("retry-unknown", ("job", 0, "retry_strategy", "jitter"), 1,
     "job[0].retry_strategy.jitter: unknown field"),
    ("epoch", ("job", 0, "epoch"), -1, f"job[0].epoch: {COUNT_RULE}"),
    ("claimed_by", ("job", 0, "claimed_by"), "", f"job[0].claimed_by: must be null or {SITE_NAME}"),
    ("winner", ("job", 0, "winner"), 7, f"job[0].winner: must be null or {SITE_NAME}"),
    ("executioner", ("job", 0, "executioner"), 1, "job[0].executioner: must be null or a string"),
    ("step_status", ("job", 0, "step_status"), "paused",
     'job[0].step_status: must be one of null, "running", "finished", "failed"'),
    ("exec_time", ("job", 0, "exec_time"), -0.5, "job[0].exec_time: must be null or a number >= 0"),
    ("start_time", ("job", 0, "start_time"), "2026-11-22 00:35:12Z",
     f"job[0].start_time: must be null or {ISO_RULE}"),
    ("finish_time", ("job", 0, "finish_time"), "2026-13-01T00:00:00Z",
     f"job[0].finish_time: must be null or {ISO_RULE}"),
    ("attempts", ("job", 0, "attempts"), 1.5, f"job[0].attempts: {COUNT_RULE}"),
    ("exit_code", ("job", 0, "exit_code"), "1", "job[0].exit_code: must be null or an integer"),
    ("output", ("job", 0, "output"), "done",
     "job[0].output: must be null or an object {stdout, stderr}"),
    ("output-missing", ("job", 0, "output"), {"stdout": ""}, "job[0].output.stderr: is missing"),
    ("output-long", ("job", 0, "output"), {"stdout": "x" * 4097, "stderr": ""},
     "job[0].output.stdout: must be at most 4096 characters long"),
    ("progress", ("job", 0, "progress"), 0.4,
     "job[0].progress: must be null or an object {fraction, message, at}"),
    ("progress-fraction", ("job", 0, "progress"), {"fraction": 1.5, "message": "", "at": T0},
     "job[0].progress.fraction: must be a number between 0 and 1"),
    ("progress-message", ("job", 0, "progress"), {"fraction": 0, "message": "x" * 201, "at": T0},
     "job[0].progress.message: must be at most 200 characters long"),
    ("progress-at", ("job", 0, "progress"), {"fraction": 0.5, "message": "half"},
     "job[0].progress.at: is missing"),
    ("step-unknown", ("job", 0, "command"), "ls", "job[0].command: unknown field"),
    ("history", ("history",), {}, "history: must be a list"),
    ("history-item", ("history", 0), "created", "history[0]: must be an object"),
    ("event", ("history", 0, "event"), "exploded",
     'history[0].event: must be one of "created", "claimed", "won", "started", "retried", '
     '"finished", "failed", "released", "cancelled", "stale_finish", "invalid", "adopted", '
     '"ready", "opened", "dropped"'),
    ("event-step", ("history", 0, "step"), None, f"history[0].step: {COUNT_RULE}"),
    ("event-site", ("history", 0, "site"), MISSING, "history[0].site: is missing"),
    ("event-worker", ("history", 0, "worker"), 3, "history[0].worker: must be null or a string"),
    ("event-epoch", ("history", 0, "epoch"), "1", f"history[0].epoch: {COUNT_RULE}"),
    ("event-at", ("history", 0, "at"), "2026-11-22T00:35:12", f"history[0].at: must be {ISO_RULE}"),
    ("event-detail", ("history", 0, "detail"), [], "history[0].detail: must be null or a string"),
    ("event-unknown", ("history", 0, "why"), "x", "history[0].why: unknown field"),
    ("keepalive_at", ("keepalive_at",), None, f"keepalive_at: must be {ISO_RULE}"),
    ("time-february-30", ("updated_at",), "2026-02-30T00:00:00Z",
     f"updated_at: must be null or {ISO_RULE}"),
    ("time-not-leap", ("created_at",), "2025-02-29T00:00:00Z",
     f"created_at: must be null or {ISO_RULE}"),
    ("time-year-zero", ("created_at",), "0000-01-01T00:00:00Z",
     f"created_at: must be null or {ISO_RULE}"),
    ("max_retries-huge", ("job", 0, "retry_strategy", "max_retries"), 1001,
     "job[0].retry_strategy.max_retries: must be an integer between 0 and 1000"),
    ("epoch-huge", ("job", 0, "epoch"), 10**9 + 1,
     f"job[0].epoch: {COUNT_RULE}"),
    ("id-empty", ("_id",), "", f"_id: {ID_RULE}"),
    ("id-long", ("_id",), "j" * 257, f"_id: {ID_RULE}"),
    ("id-control", ("_id",), "job-\x7f", f"_id: {ID_RULE}"),
    ("id-surrogate", ("_id",), "job-\udc80", f"_id: {ID_RULE}"),
    ("id-type", ("_id",), 5, f"_id: {ID_RULE}"),
    ("meta", ("meta",), ["owner"], "meta: must be an object"),
    ("meta-null", ("meta",), None, "meta: must be an object"),
    # Waiting for other jobs and for a time.
    ("after", ("after",), "job-a", "after: must be a list of at most 100 job ids"),
    ("after-many", ("after",), [f"job-{n}" for n in range(101)],
     "after: must be a list of at most 100 job ids"),
    ("after-item", ("after",), ["job-a", 7], f"after[1]: {ID_RULE}"),
    ("after-empty-id", ("after",), [""], f"after[0]: {ID_RULE}"),
    ("after-duplicate", ("after",), ["job-a", "job-a"], "after[1]: duplicate job id"),
    ("after-itself", ("after",), ["job-20261122T003512.123456Z-3fa9c2d1"],
     "after[0]: must not be the job's own id"),
    ("after_policy", ("after_policy",), "never",
     'after_policy: must be one of "success", "always"'),
    ("not_before", ("not_before",), "2026-11-23T02:00",
     f"not_before: must be null or {ISO_RULE}"),
    ("ready-typo", ("history", 0, "event"), "reddy",
     'history[0].event: must be one of "created", "claimed", "won", "started", "retried", '
     '"finished", "failed", "released", "cancelled", "stale_finish", "invalid", "adopted", '
     '"ready", "opened", "dropped"'),
    # Unknown fields, at the top as everywhere: with the nearest known one when it is near.
    ("top-unknown", ("colour",), "red", "colour: unknown field"),
    ("top-typo", ("priorty",), 5, "priorty: unknown field (did you mean 'priority'?)"),
    ("top-swapped", ("hisotry",), [], "hisotry: unknown field (did you mean 'history'?)"),
    ("top-underscore", ("_idd",), "x", "_idd: unknown field (did you mean '_id'?)"),
    ("top-too-short-to-guess", ("x",), 1, "x: unknown field"),
    ("step-typo", ("job", 0, "timout"), 5,
     "job[0].timout: unknown field (did you mean 'timeout'?)"),
    ("retry-typo", ("job", 0, "retry_strategy", "max_retires"), 2,
     "job[0].retry_strategy.max_retires: unknown field (did you mean 'max_retries'?)"),
    ("event-typo", ("history", 0, "detials"), "x",
     "history[0].detials: unknown field (did you mean 'detail'?)"),
]


@pytest.mark.parametrize(("path", "value", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_each_rule_has_its_message(path: tuple[str | int, ...], value: Any, expected: str) -> None:
    assert validate_job(change(job(), path, value)) == [expected]


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("priority",), True),
        (("step",), False),
        (("job", 0, "epoch"), True),
        (("job", 0, "attempts"), False),
        (("job", 0, "exit_code"), True),
        (("job", 0, "timeout"), True),
        (("job", 0, "retry_strategy", "max_retries"), True),
        (("history", 0, "step"), False),
    ],
)
def test_a_bool_is_not_a_number(path: tuple[str | int, ...], value: bool) -> None:
    assert len(validate_job(change(job(), path, value))) == 1


def test_all_errors_are_reported_at_once() -> None:
    doc = job(priority=None, step="0", job=[step(do=""), {"target": "any"}])
    assert validate_job(doc) == [
        "priority: must be an integer",
        "step: must be an integer",
        "job[0].do: must be a non-empty string",
        "job[1].do: is missing",
    ]


def test_without_type_only_the_type_is_reported() -> None:
    assert validate_job({"creator": 5}) == ['type: must be "job"']
    assert validate_job(["not", "an", "object"]) == ["document: must be a JSON object"]


def test_unknown_step_fields_are_reported_in_javascript_sort_order() -> None:
    doc = change(job(), ("job", 0), step(zeta=1, alpha=2, **{"10": 3, "9": 4}))
    assert [e.split(":")[0] for e in validate_job(doc)] == [
        "job[0].10", "job[0].9", "job[0].alpha", "job[0].zeta",
    ]


def test_too_large_documents_are_refused() -> None:
    doc = job(meta={"attachment_like": "x" * MAX_DOC_SIZE})
    assert validate_job(doc) == [
        "document: too large: its JSON exceeds 1048576 characters (1 MiB)"
    ]


def test_submission_gets_server_fields_but_keeps_what_it_has() -> None:
    submission = {"job": [{"target": "any", "do": "true"}]}
    assert validate_job(submission) == ['type: must be "job"']
    assert validate_submission(submission) == []
    assert validate_submission({**submission, "priority": "high"}) == [
        "priority: must be an integer"
    ]
    # A submitted step may leave its target out: it runs anywhere, as `--step` does.
    assert validate_submission({"job": [{"do": "true"}]}) == []
    assert validate_submission({"job": [{"target": "any"}]}) == ["job[0].do: is missing"]
    assert validate_submission([]) == ["document: must be a JSON object"]
    assert validate_submission({**submission, "meta": {"ticket": "OPS-1"}}) == []
    assert validate_submission({**submission, "priorty": 5}) == [
        "priorty: unknown field (did you mean 'priority'?)"
    ]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_json_size_is_what_javascript_measures() -> None:
    values: list[Any] = [
        1.0, -0.0, 0.1, 1e21, 1e-7, 123456789.125, -1.5e-7, 2**60, 1e16, 5e-324,
        "é😀\u2028\x00\x1f\"\\\n", "\ud800", True, None, [], {}, {"a": [1, {"b": None}]},
    ]
    docs = [{"v": value, "_rev": "1-a", "_revisions": {"ids": ["a"]}} for value in values]
    script = (
        "const docs = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        "console.log(JSON.stringify(docs.map(d => { delete d._rev; delete d._revisions;"
        " return JSON.stringify(d).length; })));"
    )
    node = subprocess.run(
        ["node", "-e", script], input=json.dumps(docs), capture_output=True, text=True, check=True
    )
    assert [json_size(doc) for doc in docs] == json.loads(node.stdout)


# Every JSON value, and the ones only Python has (NaN, Infinity, integers past 2**53),
# with any code point in strings and keys, lone surrogates included.
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=8)
JSON_SCALARS = (st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats()
                | ANY_TEXT)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None)
@given(JSON_VALUES)
def test_measuring_the_json_text_agrees_with_walking_the_value(value: Any) -> None:
    """json_length measures json.dumps' text and mends what Python spells otherwise;
    walking the value, one scalar at a time, is the slow reference it must match."""
    assert json_length(value) == walked_json_length(value)



@settings(max_examples=500, deadline=None)
@given(st.dictionaries(ANY_TEXT, JSON_VALUES, max_size=4), st.integers(0, 400))
@example({"a": "\ud800" * 1000}, 0)  # the most JavaScript's text grows: 5.96 times
@example({"n": [1e20] * 100}, 0)  # a number's most: 1e+20 is 21 characters
def test_the_size_limit_is_measured_exactly_only_near_it(doc: dict[str, Any],
                                                         limit: int) -> None:
    """json_size_over bounds JavaScript's text by Python's before measuring it: the
    answer is json_size's, at the limit, next to it, and at the bound itself."""
    size = json_size(doc)
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=True)
    for bound in (limit, size, size - 1, JS_GROWTH * len(text), JS_GROWTH * len(text) - 1):
        assert json_size_over(doc, bound) == (size > bound)
    assert size <= JS_GROWTH * len(text)

def test_a_number_spelled_inside_a_string_is_not_mended() -> None:
    assert json_length({"do": "echo a:1.0,"}) == len('{"do":"echo a:1.0,"}')
    assert json_length([1.0, "x:1e-05]", 1e-05]) == len('[1,"x:1e-05]",0.00001]')


def test_deep_documents_are_refused_without_measuring_them() -> None:
    assert validate_job(job(meta={"deep": nested(30)})) == []
    expected = ["document: too deeply nested: more than 32 levels of objects and lists"]
    assert validate_job(job(meta={"deep": nested(31)})) == expected
    assert validate_job(job(meta={"deep": {"a": nested(30)}})) == expected
    assert validate_job(job(meta={"deep": nested(100_000)})) == expected  # no RecursionError


def test_hints_stop_after_the_first_errors() -> None:
    """Each hint costs work: a document of many unknown fields gets hints for the first only."""
    doc = job(**{f"step{n:02d}": n for n in range(30)})
    errors = validate_job(doc)
    assert len(errors) == 30
    assert errors[0] == "step00: unknown field (did you mean 'step'?)"
    hinted = [error.endswith("(did you mean 'step'?)") for error in errors]
    assert hinted == [True] * 20 + [False] * 10


def test_meta_counts_in_the_size() -> None:
    doc = job(meta={"notes": "x" * MAX_DOC_SIZE})
    assert validate_job(doc) == [
        "document: too large: its JSON exceeds 1048576 characters (1 MiB)"
    ]


def test_json_size_survives_deep_nesting() -> None:
    nested: list[Any] = []
    for _ in range(5000):
        nested = [nested]
    assert json_size({"v": nested}) == len('{"v":}') + 2 * 5001


# --- defaults: one table, in Python and in validate_doc_update ---------------------


def javascript_defaults() -> dict[str, Doc]:
    """The *_DEFAULTS tables of validate_doc_update.js (JSON literals ending in "};")."""
    source = load_design_docs()[0]["validate_doc_update"]
    tables = re.findall(r"var (\w+_DEFAULTS) = (\{.*?\});$", source, re.DOTALL | re.MULTILINE)
    return {name: json.loads(table) for name, table in tables}


def test_the_defaults_are_the_same_table_in_python_and_javascript() -> None:
    assert javascript_defaults() == {
        "JOB_DEFAULTS": JOB_DEFAULTS, "STEP_DEFAULTS": STEP_DEFAULTS,
        "RETRY_DEFAULTS": RETRY_DEFAULTS, "EVENT_DEFAULTS": EVENT_DEFAULTS,
        "SCHEDULE_DEFAULTS": SCHEDULE_DEFAULTS,
    }


def test_the_reason_codes_are_the_same_list_in_python_and_javascript() -> None:
    source = load_design_docs()[0]["validate_doc_update"]
    listed = re.search(r"var EVENT_REASONS = (\[.*?\]);", source, re.DOTALL)
    assert listed is not None
    assert json.loads(listed.group(1)) == [reason.value for reason in Reason]


def test_an_event_may_give_a_reason_code_and_old_events_need_none() -> None:
    for reason in Reason:
        assert validate_job(change(job(), ("history", 0, "reason"), reason.value)) == []
    assert validate_job(job()) == []  # (its event has no `reason`)
    assert validate_job(change(job(), ("history", 0, "reason"), "no worker")) == [
        "history[0].reason: must be one of " + ", ".join(f'"{r}"' for r in Reason)]


def test_normalise_fills_every_default_and_changes_nothing_else() -> None:
    raw = copy.deepcopy(HTTP_JOB) | {"history": [{"event": "created", "step": 0,
                                                  "site": "global", "at": T0}]}
    filled = normalise(raw)
    assert raw == HTTP_JOB | {"history": raw["history"]}  # the document read is left as it is
    assert filled == {**JOB_DEFAULTS, **HTTP_JOB,
                      "job": [{**STEP_DEFAULTS, "do": "make", "retry_strategy": RETRY_DEFAULTS}],
                      "history": [{**raw["history"][0], **EVENT_DEFAULTS}]}
    assert normalise(filled) is filled  # nothing missing: the document itself, no copy
    assert normalise(job()) == job(job=[step(lease_until=None)])  # the one field it lacked
    # The defaults are copies: filling one document never shares a list with another.
    filled["history"].append({})
    assert normalise(HTTP_JOB)["history"] == []


def required_fields(typed: type) -> set[str]:
    """The fields a TypedDict of jobdist.model requires (its annotations are strings, so
    the class's own __required_keys__ cannot tell NotRequired ones)."""
    hints = get_type_hints(typed, include_extras=True)
    return {name for name, hint in hints.items() if get_origin(hint) is not NotRequired}


def test_the_typed_documents_require_what_normalise_makes_sure_of() -> None:
    """model.Job and its parts (what the decision core is typed in): a field with a
    default is required, since normalise fills it in; so are the fields every document
    must have; the optional fields without a default are NotRequired."""
    assert required_fields(Job) == {*JOB_DEFAULTS, "_id", "type", "creator", "job"}
    assert required_fields(Step) == {*STEP_DEFAULTS, "do"}
    assert required_fields(RetryStrategy) == set(RETRY_DEFAULTS)
    assert required_fields(Event) == {*EVENT_DEFAULTS, "event", "step", "site", "at"}
    assert required_fields(SubRun) == set(new_sub_run())


def test_normalise_tolerates_malformed_documents() -> None:
    assert normalise({"type": "job", "job": "x", "history": [1, None]})["job"] == "x"
    assert normalise({"job": [None, {"retry_strategy": 3}]})["job"] == [
        None, {**STEP_DEFAULTS, "retry_strategy": 3}]


# --- the same rules in CouchDB -------------------------------------------------------


def upload_design_docs(db_url: str) -> None:
    for design in load_design_docs():
        requests.put(f"{db_url}/{design['_id']}", json=design, timeout=10).raise_for_status()


def variant(doc: Doc, path: tuple[str | int, ...], value: Any) -> Callable[[], Doc]:
    return lambda: change(doc, path, value)


CORPUS: list[tuple[str, Callable[[], Doc]]] = [
    ("wrong-type", variant(job(), ("type",), "task")),
    ("no-type", variant(job(), ("type",), MISSING)),
    ("creator-uppercase", variant(job(), ("creator",), "Global")),
    ("priority-string", variant(job(), ("priority",), "high")),
    ("priority-bool", variant(job(), ("priority",), True)),
    ("priority-fraction", variant(job(), ("priority",), 0.5)),
    ("created-not-utc", variant(job(), ("created_at",), "2026-11-22T01:35:12+01:00")),
    ("updated-empty", variant(job(), ("updated_at",), "")),
    ("step-out-of-range", variant(job(), ("step",), 3)),
    ("status-unknown", variant(job(), ("job_status",), "done")),
    ("job-empty", variant(job(), ("job",), [])),
    ("job-object", variant(job(), ("job",), {"0": step()})),
    ("target-empty-list", variant(job(), ("job", 0, "target"), [])),
    ("target-bad-items", variant(job(), ("job", 0, "target"), ["a", "a", "B", 1, "any"])),
    ("target-number", variant(job(), ("job", 0, "target"), 7)),
    ("do-missing", variant(job(), ("job", 0, "do"), MISSING)),
    ("do-too-long-utf16", variant(job(), ("job", 0, "do"), "\U0001f600" * 32769)),
    ("retry-bad", variant(job(), ("job", 0, "retry_strategy"),
                        {"sleep_factor": 0.5, "max_time": 0, "sleep": "1", "extra": None})),
    ("retry-not-object", variant(job(), ("job", 0, "retry_strategy"), "3 times")),
    ("output-huge", variant(job(), ("job", 0, "output"), {"stdout": "x" * 5000, "stderr": 1})),
    ("progress-bad", variant(job(), ("job", 0, "progress"),
                             {"fraction": -0.1, "message": 3, "at": "now", "eta": 5})),
    ("progress-text", variant(job(), ("job", 0, "progress"), "40%")),
    ("step-unknown-fields", variant(job(), ("job", 0), step(command="ls", **{"2": 0, "Z": 1}))),
    ("runtime-bad", variant(job(), ("job", 0), step(
        epoch=-1, claimed_by="X", winner=True, step_status="paused", attempts=1.5,
        exit_code="1", start_time="yesterday", exec_time=-1, executioner=[]))),
    ("history-bad", variant(job(), ("history",), [
        {"event": "exploded", "step": -1, "at": "2026-11-22T00:35:12", "epoch": "1"}, 5])),
    ("event-reason-unknown", variant(job(), ("history", 0, "reason"), "won but no worker")),
    ("event-reason-not-text", variant(job(), ("history", 0, "reason"), ["no_worker"])),
    ("event-reason-null", variant(job(), ("history", 0, "reason"), None)),
    ("keepalive-null", variant(job(), ("keepalive_at",), None)),
    ("format-zero", variant(job(), ("format",), 0)),
    ("format-text", variant(job(), ("format",), "2")),
    ("format-fraction", variant(job(), ("format",), 2.5)),
    ("format-null", variant(job(), ("format",), None)),
    ("format-beyond-floats", variant(job(), ("format",), 10**400)),  # Infinity in JavaScript
    ("too-large", variant(job(), ("meta",), {"blob": "x" * MAX_DOC_SIZE})),
    ("too-many-steps", variant(job(), ("job",), [step(do=f"echo {i}") for i in range(1001)])),
    ("too-deep", variant(job(), ("meta",), {"a": nested(31)})),
    ("impossible-days", variant(job(), ("job", 0), step(
        start_time="2026-02-29T00:00:00Z", finish_time="2100-02-29T00:00:00Z",
        lease_until="2026-04-31T00:00:00Z"))),
    ("bad-ids", variant(job(), ("_id",), "job-\x7f\x01")),
    ("id-too-long", variant(job(), ("_id",), "é" * 257)),
    ("counts-too-large", variant(job(), ("job", 0), step(
        epoch=10**9 + 1, attempts=2**53, retry_strategy={"max_retries": 1001}))),
    ("meta-not-object", variant(job(), ("meta",), "ops")),
    # Broadcast steps: `each` only with a list (or "all"), their fields only on them.
    ("each-on-any", variant(job(), ("job", 0), step(each=True, each_policy="any"))),
    ("each-on-a-list-of-any", variant(job(), ("job", 0), step(target=["any"], each=True))),
    ("each-not-a-flag", variant(job(), ("job", 0), step(target=["a", "b"], each="yes"))),
    ("each-policy-unknown", variant(job(), ("job", 0), step(target="all", each_policy="most"))),
    ("runs-on-a-plain-step", variant(job(), ("job", 0), step(runs={"a": sub_run()},
                                                             dropped=[]))),
    ("runs-not-object", variant(job(), ("job", 0), step(target="all", runs=[1]))),
    ("runs-bad", variant(job(), ("job", 0), step(target="all", step_status="running", runs={
        "B": sub_run(), "b": 5, "a": sub_run(epoch=-1, status="paused", attempts=None,
                                             output="x", lease_until="soon", extra=1)}))),
    ("running-without-runs", variant(job(), ("job", 0), step(target="all",
                                                             step_status="running"))),
    ("dropped-not-a-site", variant(job(), ("job", 0), step(
        target=["a", "b"], each=True, step_status="running", runs={"a": sub_run()},
        dropped=["b", "a", "B", 3]))),
    ("after-bad", variant(job(), ("after",), [
        "job-a", "job-a", 3, "job-20261122T003512.123456Z-3fa9c2d1", "x\x01", "\udc80"])),
    ("after-not-list", variant(job(), ("after",), {"job-a": True})),
    ("after-too-many", variant(job(), ("after",), [f"job-{n}" for n in range(101)])),
    ("waiting-bad", lambda: job(after_policy=None, not_before="2026-11-23T02:00:00+00:00",
                                after_polcy="always", notbefore=1)),
    # Unknown fields and their hints: typos, names too far or too short to guess, UTF-16.
    ("top-level-typos", lambda: job(
        priorty=5, crator="x", stpe=0, hisotry=[], jb=[], x=1, colour="red", constructor=1,
        toString=2, Type="job", **{"😀b": 1, "é": 2, "metaa": {}, "10": 0, "job status": None})),
    ("step-typos", variant(job(), ("job", 0), step(
        timout=5, targte="any", **{"alt-do": "true", "retry strategy": {}, "Do": "ls"}))),
    ("nested-typos", variant(job(), ("job", 0, "retry_strategy"),
                             {"max_retires": 1, "sleeep": 1, "output": {"stdot": ""}})),
    ("hints-stop", lambda: job(**{f"step{n:02d}": n for n in range(30)})),
    ("everything-wrong", lambda: {
        "_id": "job-bad", "type": "job", "creator": 1, "priority": [], "created_at": 0,
        "step": None,
        "job_status": False, "job": [None, {"target": "any", "do": 3}], "history": None,
    }),
]


@pytest.mark.parametrize("make_doc", [c[1] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_couchdb_refuses_with_the_python_reason(db_url: str, make_doc: Callable[[], Doc]) -> None:
    upload_design_docs(db_url)
    doc = make_doc()
    expected = validate_job(doc)
    assert expected, "the corpus holds malformed documents only"
    response = requests.put(f"{db_url}/{doc['_id']}", json=doc, timeout=10)
    assert response.status_code == 403, response.text
    assert response.json() == {"error": "forbidden", "reason": format_errors(expected)}


def newer_format_job() -> Doc:
    """A job of a format after ours: fields we do not know, a shape we would refuse."""
    return job(_id="job-next", format=JOB_FORMAT + 1, job="steps of a later kind",
               lanes={"a": 1})


def test_a_job_of_a_newer_format_is_not_ours_to_judge() -> None:
    assert validate_job(newer_format_job()) == []
    assert validate_job(job(format=JOB_FORMAT)) == []
    assert newer_format(newer_format_job()) == JOB_FORMAT + 1
    assert newer_format(job(format=float(JOB_FORMAT + 1))) == JOB_FORMAT + 1
    assert newer_format(job()) is None and newer_format(job(format=True)) is None


def test_couchdb_stores_a_newer_format_unjudged_and_judges_ours(db_url: str) -> None:
    """A site not upgraded yet still receives newer jobs (its daemon leaves them alone)."""
    upload_design_docs(db_url)
    doc = newer_format_job()
    assert requests.put(f"{db_url}/{doc['_id']}", json=doc, timeout=10).status_code == 201
    ours = job(_id="job-ours", format=JOB_FORMAT)
    assert requests.put(f"{db_url}/job-ours", json=ours, timeout=10).status_code == 201


def test_couchdb_accepts_valid_jobs_and_deletions(db_url: str) -> None:
    upload_design_docs(db_url)
    for doc in (job(), change(finished_job(), ("_id",), "job-2"), minimal_job() | {"_id": "j3"},
                change(job(_id="job-4"), ("history", 0, "reason"), "queue_full")):
        response = requests.put(f"{db_url}/{doc['_id']}", json=doc, timeout=10)
        assert response.status_code == 201, response.text
    rev = requests.get(f"{db_url}/j3", timeout=10).json()["_rev"]
    deletion = {"_id": "j3", "_rev": rev, "_deleted": True}
    assert requests.put(f"{db_url}/j3", json=deletion, timeout=10).status_code == 201
    assert requests.get(f"{db_url}/j3", timeout=10).status_code == 404
    rev = requests.get(f"{db_url}/job-2", timeout=10).json()["_rev"]
    response = requests.delete(f"{db_url}/job-2", params={"rev": rev}, timeout=10)
    assert response.status_code == 200, response.text


# Documents as a user writes them over HTTP, without ids (POSTed): accepted or refused
# alike by the server and by validate_job, with the same reasons.
HTTP_CORPUS: list[tuple[str, Doc]] = [
    ("readme", HTTP_JOB),
    ("no-target", {"type": "job", "creator": "global", "job": [{"do": "make"}]}),
    ("with-options", HTTP_JOB | {"priority": 3, "meta": {"ticket": "OPS-1"}, "job": [
        {"do": "make", "alt_do": "make -k", "timeout": 60, "retry_strategy": {"sleep": 1}}]}),
    ("null-times", HTTP_JOB | {"created_at": None, "updated_at": None}),
    ("no-creator", {"type": "job", "job": [{"do": "make"}]}),
    ("no-steps", {"type": "job", "creator": "global"}),
    ("no-do", {"type": "job", "creator": "global", "job": [{"target": "any"}]}),
    ("typos", {"type": "job", "creator": "global", "priorty": 1,
               "job": [{"do": "make", "retry_strategy": {"max_retires": 2}}]}),
    ("waits", HTTP_JOB | {"after": ["job-a"], "after_policy": "always",
                          "not_before": "2026-11-23T02:00:00Z"}),
    ("waits-bad", HTTP_JOB | {"after": ["job-a", "job-a"], "after_policy": "", "not_before": 0}),
    ("bad-defaults", HTTP_JOB | {"step": None, "history": None, "job_status": "live",
                                 "job": [{"do": "make", "retry_strategy": None, "epoch": -1}]}),
]


@pytest.mark.parametrize("doc", [c[1] for c in HTTP_CORPUS], ids=[c[0] for c in HTTP_CORPUS])
def test_couchdb_and_python_judge_http_submissions_alike(db_url: str, doc: Doc) -> None:
    upload_design_docs(db_url)
    expected = validate_job(doc)
    response = requests.post(db_url, json=doc, timeout=10)
    if expected:
        assert response.status_code == 403, response.text
        assert response.json() == {"error": "forbidden", "reason": format_errors(expected)}
    else:
        assert response.status_code == 201, response.text


def test_couchdb_refuses_other_documents(db_url: str) -> None:
    upload_design_docs(db_url)
    response = requests.post(db_url, json={"hello": "world"}, timeout=10)
    assert response.status_code == 403
    assert response.json()["reason"] == 'type: must be "job"'


def sized_job(size: int, rev: str | None = None) -> Doc:
    """A job whose JSON is exactly `size` characters long, as JavaScript counts them."""
    meta: Doc = {"numbers": [0.1, 1e21, 2.0, -1e-7], "text": "é😀\n", "blob": ""}
    doc = job(_id="job-sized", meta=meta)
    if rev:
        doc["_rev"] = rev
    meta["blob"] = "x" * (size - json_size(doc))
    assert json_size(doc) == size
    return doc


def test_the_size_limit_is_the_same_on_both_sides(db_url: str) -> None:
    upload_design_docs(db_url)
    url = f"{db_url}/job-sized"
    created = requests.put(url, json=sized_job(MAX_DOC_SIZE), timeout=10)
    assert created.status_code == 201, created.text
    # An update: the server's document now carries _rev and _revisions, not measured.
    too_large = sized_job(MAX_DOC_SIZE + 1, rev=created.json()["rev"])
    response = requests.put(url, json=too_large, timeout=10)
    assert response.status_code == 403
    assert response.json()["reason"] == format_errors(validate_job(too_large))
    at_limit = sized_job(MAX_DOC_SIZE, rev=created.json()["rev"])
    assert requests.put(url, json=at_limit, timeout=10).status_code == 201


def test_an_empty_document_says_the_body_was_perhaps_not_json() -> None:
    from jobdist.validation import EMPTY_DOCUMENT

    assert validate_job({"_id": "x", "_rev": "1-a"}) == [EMPTY_DOCUMENT]
    assert validate_job({"_id": "x", "hello": "world"}) == ['type: must be "job"']
