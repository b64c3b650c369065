"""The bad-input corpus (issue 6): hostile job documents against real servers and daemons.

Every document here is written over plain HTTP (PUT, POST, `_bulk_docs`, and
`_bulk_docs` with `new_edits=false` as replication writes), bypassing the CLI.
Each one is either

- refused by the server's validate_doc_update with a specific `forbidden`
  reason (the very reason jobdist.validation gives), or
- accepted, and then handled by the daemons: run, released or failed with the
  reason recorded in the job, left alone when it asks for nothing, or, when it
  can never be written again (it breaks the rules, or has no room left under
  the size limit), logged, counted and skipped.

Meanwhile a batch of ordinary jobs submitted at the same time must end within
LIVENESS_BOUND, every daemon must still be alive, and no daemon log may hold a
traceback: we decided that every error a document can provoke is expected and
must be handled with a one-line log entry, so any traceback is a failure.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest
import requests

from jobdist.javascript_json import text_length
from jobdist.lab.cluster import LocalCluster
from jobdist.lab.scenarios import site_db, submit_all, wait_until_done, write_sites
from jobdist.model import ANY, Doc, event, new_job, new_step, new_sub_run
from jobdist.validation import (
    MAX_DOC_SIZE,
    MAX_STREAM_LENGTH,
    format_errors,
    json_size,
    validate_job,
)

from .test_validation import MISSING, change

pytestmark = pytest.mark.e2e

T0 = "2026-11-22T00:35:12.123456Z"
FAR = "2999-01-01T00:00:00.000000Z"
LIVENESS_BOUND = 60.0  # seconds for the ordinary jobs to end while the hostile ones are there
SITES = ("global", "reg_a")
SITE_RULE = "a site name (1-64 characters of a-z, 0-9, _ and -, starting with a letter or digit)"
ISO_RULE = "an ISO 8601 UTC time ending in Z (YYYY-MM-DDTHH:MM:SS[.ffffff]Z)"


def base(job_id: str = "job-base", *steps: Doc, creator: str = "global") -> Doc:
    """A valid job to break: one `true` step on any site by default."""
    return new_job(creator, list(steps) or [new_step("true")], created_at=T0, job_id=job_id)


# --- writing over plain HTTP ----------------------------------------------------------


@dataclass
class Raw:
    """A site's jobs database, spoken to with bare `requests`: no jobdist code in the way."""

    url: str
    session: requests.Session

    @classmethod
    def of(cls, cluster: LocalCluster, name: str, *, admin: bool = False) -> Raw:
        site = cluster.sites[name]
        session = requests.Session()
        user, password = site.couch.user, site.couch.password
        if admin and site.couch.admin_user:
            user, password = site.couch.admin_user, site.couch.admin_password
        if user:
            session.auth = (user, password or "")
        session.headers["Content-Type"] = "application/json"
        return cls(f"{site.couch.url}/{site.couch.database}", session)

    def send(self, method: str, path: str = "", body: bytes | None = None,
             **params: str) -> requests.Response:
        return self.session.request(method, f"{self.url}{path}", data=body, params=params,
                                    timeout=60)

    def put_json(self, doc: Doc) -> requests.Response:
        return self.send("PUT", "/" + quote(doc["_id"], safe=""), json.dumps(doc).encode())

    def bulk(self, docs: list[Doc], *, replicated: bool = False) -> list[Doc]:
        body: dict[str, Any] = {"docs": docs}
        if replicated:
            body["new_edits"] = False
        response = self.send("POST", "/_bulk_docs", json.dumps(body).encode())
        assert response.status_code == 201, response.text[:300]
        return response.json()

    def get(self, doc_id: str, **params: str) -> requests.Response:
        return self.send("GET", "/" + quote(doc_id, safe=""), **params)

    def leaves(self, doc_id: str) -> list[Doc]:
        answer = self.get(doc_id, open_revs="all")
        return [row["ok"] for row in answer.json()
                if "ok" in row and not row["ok"].get("_deleted")]


def replicated_rev(mark: str, generation: int = 1) -> dict[str, Any]:
    """`_rev` and `_revisions` of a revision written as a replicator would write it."""
    digest = (mark * 32)[:32]
    return {"_rev": f"{generation}-{digest}", "_revisions": {"start": generation,
                                                             "ids": [digest]}}


# --- the refused corpus: every document here is forbidden ------------------------------


@dataclass(frozen=True)
class Bad:
    name: str
    doc_id: str
    body: bytes  # JSON text: some of these cannot be built as Python objects at all
    reason: str  # a fragment the server's reason must contain: what exactly is wrong
    writes: tuple[str, ...] = ("put", "post", "bulk", "replicated")


def path_text(path: tuple[str | int, ...]) -> str:
    text = ""
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else key)
    return text


def bad(name: str, doc: Doc, reason: str, **options: Any) -> Bad:
    return Bad(name, doc["_id"], json.dumps(doc).encode(), reason, **options)


def mutated(path: tuple[str | int, ...], value: Any, reason: str, name: str = "") -> Bad:
    name = name or path_text(path)
    doc = change(base(f"bad-{name}"), path, value)
    return bad(name, doc, reason)


def spliced(name: str, field_text: str, reason: str) -> Bad:
    """A document with a top-level field written as raw JSON text."""
    doc_id = f"bad-{name}"
    text = json.dumps(base(doc_id))
    return Bad(name, doc_id, (text[:-1] + ", " + field_text + "}").encode(), reason)


STEP = ("job", 0)
RETRY = ("job", 0, "retry_strategy")
EVENT = ("history", 0)

# A value of the wrong type for every field, at every level of the document.
WRONG_TYPES: list[tuple[tuple[str | int, ...], Any]] = [
    (("type",), 5), (("creator",), 7), (("priority",), "1"), (("created_at",), 0),
    (("updated_at",), 5), (("step",), "0"), (("job_status",), True), (("job",), "sleep 1"),
    (STEP, ["true"]), ((*STEP, "target"), {"site": "global"}), ((*STEP, "do"), ["true"]),
    ((*STEP, "alt_do"), 0), ((*STEP, "timeout"), "1"), (RETRY, None),
    ((*RETRY, "max_retries"), "3"), ((*RETRY, "max_time"), True), ((*RETRY, "sleep"), []),
    ((*RETRY, "sleep_factor"), {}), ((*RETRY, "sleep_max"), "x"), ((*STEP, "epoch"), "1"),
    ((*STEP, "claimed_by"), 3), ((*STEP, "winner"), []), ((*STEP, "executioner"), 5),
    ((*STEP, "step_status"), 1), ((*STEP, "exec_time"), "x"), ((*STEP, "start_time"), 5),
    ((*STEP, "finish_time"), []), ((*STEP, "lease_until"), 1), ((*STEP, "attempts"), "1"),
    ((*STEP, "exit_code"), 1.5), ((*STEP, "output"), []),
    ((*STEP, "output"), {"stdout": 5, "stderr": None}), (("history",), "created"),
    (EVENT, 5), ((*EVENT, "event"), 5), ((*EVENT, "step"), "0"), ((*EVENT, "site"), None),
    ((*EVENT, "worker"), 5), ((*EVENT, "epoch"), "1"), ((*EVENT, "at"), 5),
    ((*EVENT, "detail"), {}), (("keepalive_at",), 5),
]

# The fields with no default (docs/job-document.md#defaults): any other may be left out.
REQUIRED = [
    ("creator",), ("job",), (*STEP, "do"), (*EVENT, "event"), (*EVENT, "step"),
    (*EVENT, "site"), (*EVENT, "at"),
]


def deep(depth: int) -> str:
    return '"meta": {"deep": ' + "[" * depth + "]" * depth + "}"


REFUSED: list[Bad] = [
    *(mutated(path, value, path_text(path), f"type-{path_text(path)}")
      for path, value in WRONG_TYPES),
    *(mutated(path, MISSING, f"{path_text(path)}: is missing", f"missing-{path_text(path)}")
      for path in REQUIRED),
    mutated(("type",), MISSING, 'type: must be "job"', "missing-type"),
    mutated(("type",), "Job", 'type: must be "job"', "type-case"),
    # Targets that are no site name at all (a well-formed unknown name is accepted: below).
    mutated((*STEP, "target"), "Mallory!", 'job[0].target: must be "any", a site name or a'),
    mutated((*STEP, "target"), [], "job[0].target: must not be an empty list", "target-empty"),
    mutated((*STEP, "target"), ["reg_a", "reg_a"], "job[0].target[1]: duplicate site name",
            "target-duplicate"),
    mutated((*STEP, "target"), ["any", 5], f"job[0].target[1]: must be {SITE_RULE}",
            "target-item"),
    mutated((*STEP, "target"), "réG", "job[0].target: must be", "target-unicode"),
    # Huge strings and documents.
    mutated((*STEP, "do"), "x" * 65537, "job[0].do: must be at most 65536 characters long",
            "do-huge"),
    mutated((*STEP, "alt_do"), "😀" * 40000, "job[0].alt_do: must be at most 65536 characters",
            "alt_do-huge-utf16"),
    mutated((*STEP, "output"), {"stdout": "x" * 4097, "stderr": ""},
            "job[0].output.stdout: must be at most 4096 characters long", "output-huge"),
    mutated(("creator",), "g" * 65, f"creator: must be {SITE_RULE}", "creator-long"),
    mutated(("meta",), {"blob": "x" * MAX_DOC_SIZE}, "document: too large", "document-huge"),
    mutated((*EVENT, "detail"), "\x01" * (MAX_DOC_SIZE // 6 + 1), "document: too large",
            "detail-escapes-past-the-limit"),
    # Deep nesting: cheap to send, and deep enough to break a recursive JSON parser.
    spliced("nesting-1500", deep(1500), "document: too deeply nested"),
    spliced("nesting-5000", deep(5000), "document: too deeply nested"),
    # Unicode garbage where names and times are expected.
    mutated(("creator",), "glöbal", f"creator: must be {SITE_RULE}", "creator-unicode"),
    mutated(("creator",), "global\n", f"creator: must be {SITE_RULE}", "creator-newline"),
    mutated(("created_at",), "\uff12\uff10\uff12\uff16-11-22T00:35:12Z",
            f"created_at: must be null or {ISO_RULE}", "time-fullwidth-digits"),
    mutated(("updated_at",), "2026-02-30T00:00:00Z", f"updated_at: must be null or {ISO_RULE}",
            "time-february-30"),
    mutated((*STEP, "lease_until"), "2025-02-29T00:00:00.0Z",
            f"job[0].lease_until: must be null or {ISO_RULE}", "time-not-a-leap-year"),
    mutated(("created_at",), "0000-01-01T00:00:00Z", f"created_at: must be null or {ISO_RULE}",
            "time-year-zero"),
    mutated((*STEP, "step_status"), "RUNNING", "job[0].step_status: must be one of",
            "status-case"),
    mutated((*EVENT, "event"), "créé", "history[0].event: must be one of", "event-unicode"),
    Bad("creator-invalid-utf8", "bad-creator-invalid-utf8",
        json.dumps(base("bad-creator-invalid-utf8")).encode().replace(
            b'"creator": "global"', b'"creator": "glob\xff\xfeal"'),
        f"creator: must be {SITE_RULE}"),
    # Ids a daemon could not even put in a URL or an environment variable.
    bad("id-nul", base("job-\x00-nul"), "_id: must be", writes=("post", "bulk", "replicated")),
    bad("id-lone-surrogate", base("job-\ud800-x"), "_id: must be",
        writes=("post", "bulk", "replicated")),
    bad("id-huge", base("job-" + "x" * 300), "_id: must be"),
    # Absurd numbers.
    mutated(("priority",), 1.5, "priority: must be an integer", "priority-fraction"),
    spliced("priority-infinite", '"priority": 1e400', "priority: must be an integer"),
    mutated((*RETRY, "max_retries"), -1, "job[0].retry_strategy.max_retries: must be",
            "retries-negative"),
    mutated((*RETRY, "max_retries"), 10**12, "job[0].retry_strategy.max_retries: must be",
            "retries-huge"),
    mutated((*STEP, "timeout"), 0, "job[0].timeout: must be null or a number > 0",
            "timeout-zero"),
    mutated((*STEP, "timeout"), -5, "job[0].timeout: must be null or a number > 0",
            "timeout-negative"),
    mutated((*STEP, "timeout"), "NaN", "job[0].timeout: must be null or a number > 0",
            "timeout-nan"),
    mutated((*RETRY, "sleep_factor"), 0.5, "sleep_factor: must be null or a number >= 1",
            "sleep-factor-shrinking"),
    mutated((*STEP, "epoch"), 2**60, "job[0].epoch: must be an integer between", "epoch-huge"),
    mutated((*STEP, "attempts"), -3, "job[0].attempts: must be an integer between",
            "attempts-negative"),
    mutated(("step",), 2, "step: must be between 0 and 1 (the number of steps)", "step-past"),
    mutated(("step",), -1, "step: must be between 0 and 1 (the number of steps)",
            "step-negative"),
    # Extra fields: every object is closed; the user's own data goes in `meta` (below).
    mutated(("priorty",), 5, "priorty: unknown field (did you mean 'priority'?)",
            "top-level-extra"),
    mutated(("meta",), ["not", "an", "object"], "meta: must be an object", "meta-not-object"),
    mutated((*STEP, "command"), "rm -rf /", "job[0].command: unknown field", "step-extra"),
    mutated((*RETRY, "jitter"), 1, "job[0].retry_strategy.jitter: unknown field",
            "retry-extra"),
    mutated((*STEP, "output"), {"stdout": "", "stderr": "", "exit": 0},
            "job[0].output.exit: unknown field", "output-extra"),
    mutated((*EVENT, "why"), "x", "history[0].why: unknown field", "event-extra"),
    # Steps: none, too many, not a list.
    mutated(("job",), [], "job: must be a non-empty list of steps", "steps-empty"),
    mutated(("job",), [new_step(f"echo {n}") for n in range(1001)],
            "job: must have at most 1000 steps", "steps-1001"),
    mutated(("job",), {"0": new_step("true")}, "job: must be a non-empty list of steps",
            "steps-object"),
    # Malformed history.
    mutated(("history",), [{"event": "created"}], "history[0].step: is missing",
            "history-partial"),
    mutated((*EVENT, "at"), "2026-11-22T00:35:12", f"history[0].at: must be {ISO_RULE}",
            "history-time-no-zone"),
    mutated((*EVENT, "step"), -1, "history[0].step: must be an integer between",
            "history-step-negative"),
    # A job pretending to have ended, in words the rules do not know.
    mutated(("job_status",), "done", "job_status: must be one of", "pretends-done"),
    mutated((*STEP, "step_status"), "complete", "job[0].step_status: must be one of",
            "pretends-complete"),
    # Not a job at all.
    Bad("not-a-job", "bad-not-a-job", b'{"_id": "bad-not-a-job", "hello": "world"}',
        'type: must be "job"'),
    Bad("array", "bad-array", b'[{"type": "job"}]', "document: must be a JSON object",
        writes=("post",)),
    Bad("empty-body", "bad-empty-body", b"", "document: empty: was the body sent as JSON?",
        writes=("put",)),
]


def write_refused(raw: Raw, case: Bad, how: str) -> tuple[str, str]:
    """Write one way; the server's (error, reason)."""
    if how == "put":
        answer = raw.send("PUT", "/" + quote(case.doc_id, safe=""), case.body)
        assert answer.status_code == 403, answer.text[:300]
        body = answer.json()
    elif how == "post":
        answer = raw.send("POST", "", case.body)
        assert answer.status_code == 403, answer.text[:300]
        body = answer.json()
    else:
        text = case.body
        if how == "replicated":  # as a replicator writes it: a revision with its history
            rev = json.dumps(replicated_rev("e"))[1:-1].encode()
            text = b"{" + rev + b", " + text.lstrip()[1:]
        flag = b', "new_edits": false' if how == "replicated" else b""
        answer = raw.send("POST", "/_bulk_docs", b'{"docs": [' + text + b"]" + flag + b"}")
        assert answer.status_code == 201, answer.text[:300]
        (body,) = answer.json()
    return body.get("error", ""), body.get("reason", "")


def python_reason(body: bytes) -> str | None:
    """What jobdist.validation says, when Python can decode the document at all."""
    try:
        return format_errors(validate_job(json.loads(body)))
    except (ValueError, RecursionError):
        return None


@pytest.mark.parametrize("case", REFUSED, ids=[case.name for case in REFUSED])
def test_the_server_refuses_with_a_specific_reason(cluster: LocalCluster, case: Bad) -> None:
    raw = Raw.of(cluster, "global")
    expected = python_reason(case.body)
    for how in case.writes:
        error, reason = write_refused(raw, case, how)
        assert (error, how) == ("forbidden", how), reason
        assert case.reason in reason, (how, reason)
        if expected is not None:
            assert reason == expected, how  # the same words as `jobdist validate`
    if "put" in case.writes:
        assert raw.get(case.doc_id).status_code == 404  # nothing was stored


def test_a_job_sent_without_its_json_content_type_is_refused_saying_so(
        cluster: LocalCluster) -> None:
    """curl -d without -H 'Content-Type: application/json', as a new user types it:
    pouchdb-server reads the form encoding as an empty document, which the rules
    refuse naming the likely cause, not the missing `type` (CouchDB answers 415)."""
    raw = Raw.of(cluster, "global")
    body = json.dumps(new_job("global", [new_step("true")])).encode()
    answer = raw.session.post(raw.url, data=body, timeout=60,
                              headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert answer.status_code in (403, 415), answer.text[:300]
    if answer.status_code == 403:
        assert "Content-Type: application/json" in answer.json()["reason"]


@pytest.mark.parametrize("body", [b"garbage{", b'"a string"', b"\xff\xfe\x00", b"[" * 100_000])
def test_unparseable_bodies_are_refused_as_bad_requests(cluster: LocalCluster,
                                                        body: bytes) -> None:
    answer = Raw.of(cluster, "global").send("PUT", "/bad-unparseable", body)
    assert answer.status_code == 400, answer.text[:300]
    assert answer.json()["error"] == "bad_request"


# --- the accepted corpus: valid documents a daemon must cope with ----------------------


@dataclass(frozen=True)
class Hostile:
    """A document the rules accept; `outcome` is what the daemons must make of it."""

    name: str
    docs: list[Doc]  # one document, or several leaves of one (written as a replicator would)
    outcome: str  # success | failed | unchanged
    detail: str = ""  # in the history (failed), or in the daemon log (unchanged)
    resolved: bool = True  # no conflict left (only a known creator deletes losing leaves)

    @property
    def doc_id(self) -> str:
        return self.docs[0]["_id"]


def hostile(name: str, *steps: Doc, creator: str = "global", **fields: Any) -> Doc:
    doc = base(f"hostile-{name}", *steps, creator=creator)
    doc.update(fields)
    return doc


def with_step(doc: Doc, **fields: Any) -> Doc:
    doc["job"][0].update(fields)
    return doc


def with_runtime_fields_removed(doc: Doc, *names: str) -> Doc:
    for name in names:
        doc["job"][0].pop(name)
    return doc


def padded(doc: Doc, size: int) -> Doc:
    """The document grown, through its `created` event's detail, to `size` characters."""
    doc["history"][0]["detail"] = ""
    doc["history"][0]["detail"] = "x" * (size - json_size(doc))
    return doc


def leaves_of(doc: Doc, *variants: Callable[[Doc], Doc], marks: str = "0123456789abcdef"
              ) -> list[Doc]:
    """Conflicting root revisions of one job, each `variant` applied to a copy.

    CouchDB's winner among them is the one with the highest mark.
    """
    return [variant(json.loads(json.dumps(doc))) | replicated_rev(marks[n])
            for n, variant in enumerate(variants)]


def same(doc: Doc) -> Doc:
    return doc


def claimed_by_reg_a(doc: Doc) -> Doc:
    return with_step(doc, claimed_by="reg_a")


def one_more_step(doc: Doc) -> Doc:
    doc["job"].append(new_step("echo a step the original never had"))
    return doc


def adopted_by(site: str) -> Callable[[Doc], Doc]:
    """A leaf where `site` adopted the job, its event without a term (`epoch` is optional)."""
    def adopt(doc: Doc) -> Doc:
        doc["history"].append({"event": "adopted", "step": 0, "site": site, "at": T0})
        return doc
    return adopt


def bare(name: str, *steps: Doc, creator: str = "global") -> Doc:
    """A job as a user writes it over HTTP: no field that has a default."""
    return {"_id": f"hostile-{name}", "type": "job", "creator": creator,
            "job": list(steps) or [{"do": "true"}]}


def bloated(n: int) -> Doc:
    """A job with no room left for any other revision, not even a keep-alive re-save
    (`keepalive_at` grows by a time): `do` cannot be shed."""
    steps = [new_step(": " + "x" * 58000, target=ANY) for _ in range(18)]
    doc = hostile(f"bloated-{n}", *steps, priority=10**6)
    doc["job"][-1]["do"] = ""
    doc["job"][-1]["do"] = ": " + "y" * (MAX_DOC_SIZE - 10 - json_size(doc))
    return doc


HOSTILE: list[Hostile] = [
    Hostile("unknown-target", [hostile("unknown-target", new_step("true", target="mallory"))],
            "failed", "no known site matches target 'mallory'"),
    Hostile("unknown-targets", [hostile("unknown-targets",
                                        new_step("true", target=["mallory", "eve"]))],
            "failed", "no known site matches target"),
    Hostile("unknown-creator", [hostile("unknown-creator", creator="mallory")],
            "failed", "creator 'mallory' is not a known site"),
    Hostile("pretends-finished", [with_step(
        hostile("pretends-finished", new_step("false"), step=1, job_status="success"),
        step_status="finished", exit_code=0, output={"stdout": "fake", "stderr": ""})],
            "unchanged"),
    Hostile("pretends-current-step-ended", [with_step(
        hostile("pretends-current-step-ended"), step_status="finished", exit_code=0)],
            "failed", "inconsistent: the current step already ended"),
    Hostile("pretends-running-at-reg_a", [with_step(
        hostile("pretends-running-at-reg_a"), step_status="running", claimed_by="reg_a",
        winner="reg_a", epoch=1, executioner="reg_a/w9", start_time=T0, lease_until=FAR)],
            "success"),
    Hostile("pretends-running-at-unknown-site", [with_step(
        hostile("pretends-running-at-unknown-site"), step_status="running", claimed_by="mallory",
        winner="mallory", epoch=1, executioner="mallory/w1", start_time=T0, lease_until=FAR)],
            "success"),
    Hostile("running-without-winner", [with_runtime_fields_removed(with_step(
        hostile("running-without-winner"), step_status="running"), "winner", "claimed_by")],
            "success"),
    Hostile("claimed-by-unknown-site", [with_step(
        hostile("claimed-by-unknown-site"), claimed_by="mallory")], "success"),
    Hostile("lease-time-without-fraction", [with_step(
        hostile("lease-time-without-fraction"), step_status="running", claimed_by="reg_a",
        winner="reg_a", epoch=1, start_time="2020-01-01T00:00:00Z",
        lease_until="2020-01-01T00:00:00Z")], "success"),
    Hostile("times-in-nanoseconds", [hostile(
        "times-in-nanoseconds", created_at="2026-11-22T00:35:12.123456789Z",
        updated_at="2026-11-22T00:35:12.999999999Z", keepalive_at="2026-11-22T00:35:13Z")],
            "success"),
    Hostile("user-meta", [hostile(
        "user-meta", meta={"$where": "1", "__proto__": {"admin": True},
                           "nested": [[[[["fine"]]]]]})], "success"),
    Hostile("do-huge", [hostile("do-huge", new_step(": " + "x" * 65000))], "success"),
    Hostile("document-at-the-size-limit", [padded(hostile("document-at-the-size-limit"),
                                                  MAX_DOC_SIZE - 50)], "success"),
    Hostile("absurd-but-valid-numbers", [hostile(
        "absurd-but-valid-numbers", new_step("true", timeout=1e300, max_retries=1000,
                                             max_time=1e300, sleep=0, sleep_factor=1e300,
                                             sleep_max=1e300), priority=-(10**15))],
            "success"),
    Hostile("epoch-near-its-bound", [with_step(hostile("epoch-near-its-bound"),
                                               epoch=999_999_990)], "success"),
    Hostile("unicode-garbage", [hostile(
        "unicode-garbage", new_step("echo 'ünïcødé 😀 \u202e \u2028'"),
        history=[event("created", step=0, site="global", at=T0, worker="💣",
                       detail="\x00\x1b[31m\ufffd\ud83d")])], "success"),
    Hostile("do-with-nul", [hostile("do-with-nul", new_step("echo a\x00b"))], "failed",
            "could not start"),
    Hostile("do-with-lone-surrogate", [hostile("do-with-lone-surrogate",
                                               new_step("echo \udcff\ud800"))],
            "failed", "could not start"),
    Hostile("conflicting-claims", leaves_of(hostile("conflicting-claims"), same,
                                            claimed_by_reg_a), "success"),
    Hostile("conflicting-definitions", leaves_of(hostile("conflicting-definitions"), same,
                                                 one_more_step), "success"),
    Hostile("adoption-without-a-term", leaves_of(hostile("adoption-without-a-term"), same,
                                                 adopted_by("reg_a")), "success"),
    Hostile("adopted-by-unknown-site", leaves_of(hostile("adopted-by-unknown-site"), same,
                                                 adopted_by("mallory")),
            "failed", "creator 'mallory' is not a known site", resolved=False),
    Hostile("sixteen-conflicts", leaves_of(hostile("sixteen-conflicts"), *[same] * 16),
            "success"),
    Hostile("bare", [bare("bare")], "success"),
    Hostile("bare-for-reg_a", [bare("bare-for-reg_a", {"target": "reg_a", "do": "true"})],
            "success"),
    Hostile("bare-with-unknown-creator", [bare("bare-with-unknown-creator", creator="mallory")],
            "failed", "creator 'mallory' is not a known site"),
    Hostile("bloated", [bloated(0)], "unchanged", "write refused"),
    # Broadcast steps: parts for sites nobody knows, an empty set, a part pretending to run.
    Hostile("broadcast-to-unknown-sites", [hostile(
        "broadcast-to-unknown-sites", new_step("true", target=["reg_a", "mallory"], each=True))],
            "success"),
    Hostile("broadcast-opened-at-unknown-site", [with_step(
        hostile("broadcast-opened-at-unknown-site", new_step("true", target="all")),
        step_status="running", runs={"global": new_sub_run(), "mallory": new_sub_run()})],
            "success"),
    Hostile("broadcast-opened-at-no-site", [with_step(
        hostile("broadcast-opened-at-no-site", new_step("true", target="all"),
                new_step("true", target="reg_a")), step_status="running", runs={})],
            "success"),
    Hostile("broadcast-part-pretends-running", [with_step(
        hostile("broadcast-part-pretends-running", new_step("true", target="all")),
        step_status="running", runs={"global": new_sub_run(), "reg_a": {
            **new_sub_run(), "status": "running", "epoch": 3, "executioner": "reg_a/w9",
            "start_time": T0, "lease_until": FAR}})], "success"),
    *(Hostile(f"epoch-at-its-bound-{n}", [with_step(
        hostile(f"epoch-at-its-bound-{n}", priority=10**6), epoch=1_000_000_000)],
        "failed", "the server refused") for n in range(10)),
]


# --- steps that print garbage ----------------------------------------------------------

GARBAGE: dict[str, tuple[str, str | None]] = {
    # name: (command, the exact stdout tail expected, or None when it is random)
    "urandom-3MB": ("head -c 3000000 /dev/urandom; head -c 3000000 /dev/urandom >&2", None),
    "megabytes-of-lines": ("yes garbage | head -c 5000000",
                           ("garbage\n" * 625000)[-4096:]),
    "no-trailing-newline": ("printf abc", "abc"),
    "nul-bytes": ("printf 'a\\000b\\000c'", "a\ufffdb\ufffdc"),
    "invalid-utf8": ("printf '\\377\\376 bad \\300\\200 utf8 \\355\\240\\200'",
                     "\ufffd\ufffd bad \ufffd\ufffd utf8 \ufffd\ufffd\ufffd"),
    "utf8-cut-by-the-tail": ("printf 'x'; i=0; while [ $i -lt 3000 ]; do printf 'é'; "
                             "i=$((i+1)); done", "é" * 2048),
    "control-characters": ("head -c 100000 /dev/zero | tr '\\000' '\\001'", "\x01" * 4096),
}


def garbage_job(name: str, command: str) -> Doc:
    return base(f"garbage-{name}", new_step(command, timeout=60))


def growing_job() -> Doc:
    """30 steps that each leave 2 x 4 KiB of control characters: 6 JSON characters each.

    The outputs alone would take the document past 1 MiB by step 22.
    """
    command = ("head -c 5000 /dev/zero | tr '\\000' '\\001'; "
               "head -c 5000 /dev/zero | tr '\\000' '\\002' >&2")
    return base("growing-outputs", *[new_step(command, target="global") for _ in range(30)])


# --- documents written where validation was off ----------------------------------------

INVALID: list[Doc] = [
    change(base("invalid-priority"), ("priority",), "high"),
    change(base("invalid-step-field"), (*STEP, "command"), "ls"),
    *(change(base(f"invalid-urgent-{n}"), ("job_status",), "urgent") | {"priority": 10**6}
      for n in range(10)),
]
DEEP_ID = "invalid-nested-1500"
CONFLICT_ID = "invalid-leaf-in-conflict"


@contextlib.contextmanager
def without_validation(raw: Raw) -> Iterator[None]:
    """The design document without validate_doc_update for a moment, then as it was."""
    design = raw.get("_design/jobdist").json()
    rules = design.pop("validate_doc_update")
    answer = raw.send("PUT", "/_design/jobdist", json.dumps(design).encode())
    assert answer.status_code == 201, answer.text[:300]
    try:
        yield
    finally:
        design |= {"_rev": answer.json()["rev"], "validate_doc_update": rules}
        restored = raw.send("PUT", "/_design/jobdist", json.dumps(design).encode())
        assert restored.status_code == 201, restored.text[:300]


def write_invalid(raw: Raw) -> None:
    """Invalid documents, as they would be found in a database that had no rules yet."""
    for doc in INVALID:
        assert raw.put_json(doc).status_code == 201
    text = json.dumps(base(DEEP_ID))
    assert raw.send("PUT", "/" + DEEP_ID, (text[:-1] + ", " + deep(1500) + "}").encode()).ok
    # The broken leaf is CouchDB's winner: the daemons must look past it.
    leaves = leaves_of(base(CONFLICT_ID), same, lambda doc: change(doc, ("creator",), "Global"),
                       marks="0f")
    assert all("error" not in row for row in raw.bulk(leaves, replicated=True))


# --- the run: everything at once, on a two-site cluster --------------------------------


@dataclass
class Run:
    cluster: LocalCluster
    normal_ids: list[str]
    normal_seconds: float
    ended: dict[str, Doc] = field(default_factory=dict)  # final merged view by id
    written: dict[str, list[str]] = field(default_factory=dict)  # leaf revs written, by id

    def log(self, site: str) -> str:
        return (self.cluster.site_dir(site) / "daemon.log").read_text(errors="replace")

    def logged(self, site: str, doc_id: str, text: str) -> bool:
        """Did the site log `text` about this job?"""
        return any(f"job={doc_id} " in line and text in line
                   for line in self.log(site).splitlines())

    def tracebacks(self, site: str) -> list[str]:
        """Tracebacks in the site's log, and anything at all on its stderr."""
        entries = re.split(r"\n(?=\d{4}-\d\d-\d\d \d\d:)", self.log(site))
        stderr = (self.cluster.site_dir(site) / "daemon.err").read_text(errors="replace")
        return [entry for entry in entries if "Traceback" in entry] + ([stderr] if stderr else [])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("bad-input")
    with LocalCluster(write_sites(root / "sites", len(SITES), workers=2, lease=6.0),
                      root / "state", in_memory=True) as local:
        yield local


def write_hostile(raw: Raw) -> dict[str, list[str]]:
    written = {}
    for case in HOSTILE:
        if len(case.docs) == 1:
            answer = raw.put_json(case.docs[0])
            assert answer.status_code == 201, (case.name, answer.text[:300])
            written[case.doc_id] = [answer.json()["rev"]]
        else:
            rows = raw.bulk(case.docs, replicated=True)
            assert all("error" not in row for row in rows), (case.name, rows)
            written[case.doc_id] = [doc["_rev"] for doc in case.docs]
    return written


@pytest.fixture(scope="module")
def run(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Run:
    raw = Raw.of(cluster, "global")
    db = site_db(cluster, "global")
    with without_validation(Raw.of(cluster, "global", admin=True)):
        write_invalid(raw)
    written = write_hostile(raw)
    db.bulk_docs([garbage_job(name, command) for name, (command, _) in GARBAGE.items()]
                 + [growing_job()])
    started = time.monotonic()
    normal = submit_all(db, "global", [new_step("sleep 0.2"), new_step("sleep 0.2")], 8)
    wait_until_done(db, normal, LIVENESS_BOUND)
    result = Run(cluster, normal, time.monotonic() - started, written=written)
    ending = [case.doc_id for case in HOSTILE if case.outcome != "unchanged"]
    ending += [f"garbage-{name}" for name in GARBAGE] + ["growing-outputs", CONFLICT_ID]
    for doc in wait_until_done(db, ending, LIVENESS_BOUND):
        result.ended[doc["_id"]] = doc
    time.sleep(2.0)  # let anything that would wrongly act on the rest have its chance
    return result


def test_ordinary_jobs_end_within_the_bound(run: Run) -> None:
    assert run.normal_seconds < LIVENESS_BOUND  # about 3 s here; the bound is generous
    statuses = {doc["job_status"] for doc in site_db(run.cluster, "global").bulk_get(
        run.normal_ids)}
    assert statuses == {"success"}


@pytest.mark.parametrize("case", HOSTILE, ids=[case.name for case in HOSTILE])
def test_accepted_hostile_documents_are_handled(run: Run, case: Hostile) -> None:
    raw = Raw.of(run.cluster, "global")
    leaves = raw.leaves(case.doc_id)
    if case.outcome == "unchanged":
        assert sorted(leaf["_rev"] for leaf in leaves) == sorted(run.written[case.doc_id])
        if case.detail:
            assert run.logged("global", case.doc_id, case.detail)
        return
    doc = run.ended[case.doc_id]
    assert len(leaves) == 1 or not case.resolved, "the creator resolved every conflict"
    assert doc["job_status"] == case.outcome, doc["history"][-3:]
    if case.detail:
        assert any(case.detail in (entry.get("detail") or "") for entry in doc["history"])


@pytest.mark.parametrize("name", list(GARBAGE))
def test_garbage_output_is_stored_as_a_bounded_tail(run: Run, name: str) -> None:
    answer = Raw.of(run.cluster, "global").get(f"garbage-{name}")
    doc = json.loads(answer.text)  # strict JSON, as stored
    assert doc["job_status"] == "success"
    output = doc["job"][0]["output"]
    expected = GARBAGE[name][1]
    for stream in ("stdout", "stderr"):
        assert text_length(output[stream]) <= MAX_STREAM_LENGTH
        assert "\x00" not in output[stream]
        output[stream].encode("utf-8")  # no lone surrogates
    if expected is not None:
        assert output["stdout"] == expected
    else:
        assert len(output["stdout"]) > 3000 and len(output["stderr"]) > 3000


def test_a_job_whose_outputs_outgrow_the_size_limit_still_ends(run: Run) -> None:
    doc = run.ended["growing-outputs"]
    assert doc["job_status"] == "success"
    assert json_size(doc) <= MAX_DOC_SIZE
    assert doc["job"][-1]["output"]["stdout"] == "\x01" * 4096  # the newest output is kept
    assert doc["job"][0]["output"] is None  # the oldest made room


def test_invalid_documents_are_recorded_and_skipped(run: Run) -> None:
    raw = Raw.of(run.cluster, "global")
    for doc in INVALID:
        assert run.logged("global", doc["_id"], "invalid revision ignored"), doc["_id"]
        assert raw.get(doc["_id"]).json()["_rev"].startswith("1-"), "nobody wrote to it"
    assert run.logged("global", DEEP_ID, "cannot decode: Undecodable")
    assert raw.get(DEEP_ID).status_code == 200
    resolved = run.ended[CONFLICT_ID]
    assert resolved["job_status"] == "success"
    assert [leaf["_rev"] for leaf in raw.leaves(CONFLICT_ID)] == [resolved["_rev"]]
    recorded = [entry for entry in resolved["history"] if entry["event"] == "invalid"]
    assert len(recorded) == 1 and "creator: must be" in recorded[0]["detail"]
    # The other site never took them: its own rules refused the replicated revisions.
    other = Raw.of(run.cluster, "reg_a")
    assert all(other.get(doc["_id"]).status_code == 404 for doc in INVALID)


def test_every_daemon_survived_without_a_traceback(run: Run) -> None:
    for name in SITES:
        assert run.cluster.daemon_proc(name).alive(), name
        # Keep-alive included: a priority of any type once aborted its every pass.
        tracebacks = run.tracebacks(name)
        assert tracebacks == [], tracebacks[0][:4000]
