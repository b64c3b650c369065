"""Job files and `--step` options, read into a submission (plain JSON values).

A job file is JSON or YAML (`-`: standard input); YAML is read safely and
limited to what JSON can hold, so a file means the same job either way.
What cannot be read is an `UnreadableFile`; options that do not add up are a
`BadOptions`: each one line that says what to fix.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobdist.clock import format_time, later, parse_duration, utc_now
from jobdist.errors import JobdistError
from jobdist.javascript_json import LONE_SURROGATE
from jobdist.model import ALL, ANY, Doc
from jobdist.validation import MAX_DOC_SIZE


class UnreadableFile(JobdistError):
    """The file is missing, unreadable or not JSON/YAML; the message says which."""


class BadOptions(JobdistError):
    """`--step` options that do not add up to a job."""


def per_step(name: str, values: tuple[Any, ...], count: int, *, once_for_all: bool) -> list[Any]:
    """A per-step option's value for each step: none, once for all, or one per step."""
    if not values:
        return [None] * count
    if len(values) == count:
        return list(values)
    if once_for_all and len(values) == 1:
        return [values[0]] * count
    allowed = "once for every step or once per --step" if once_for_all else "once per --step"
    raise BadOptions(f"{name} is given {len(values)} times for {count} steps: give it {allowed}")


def parse_target(text: str) -> str | list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise BadOptions(f"--target {text!r}: name a site, a comma-separated list, or any")
    return names[0] if len(names) == 1 else names


def job_submission(file: str | None, file_format: str, steps: tuple[str, ...],
                   targets: tuple[str, ...] = (), retries: tuple[int, ...] = (),
                   timeouts: tuple[float, ...] = (), alts: tuple[str, ...] = (),
                   priority: int | None = None) -> Any:
    """The job of a FILE or of `--step` options (one of the two); --priority overrides
    the file's."""
    if file is not None and steps:
        raise BadOptions("give a job FILE or --step options, not both")
    if file is None:
        if not steps:
            raise BadOptions("nothing to submit: give a job FILE (`-` for stdin) or --step CMD")
        submission = submission_from_flags(steps, targets, retries, timeouts, alts, priority)
        problem = non_json_value(submission)  # the shell hands on bytes that are not UTF-8
        if problem:
            raise BadOptions(f"--step, --target or --alt: {problem}")
        return submission
    if targets or retries or timeouts or alts:
        raise BadOptions("--target, --retries, --timeout and --alt go with --step, "
                         "not with a job FILE")
    submission = read_job_file(file, file_format)
    if priority is not None and isinstance(submission, dict):
        submission["priority"] = priority
    return submission


def submission_from_flags(steps: tuple[str, ...], targets: tuple[str, ...],
                          retries: tuple[int, ...], timeouts: tuple[float, ...],
                          alts: tuple[str, ...], priority: int | None) -> Doc:
    count = len(steps)
    step_targets = per_step("--target", targets, count, once_for_all=False)
    step_retries = per_step("--retries", retries, count, once_for_all=True)
    step_timeouts = per_step("--timeout", timeouts, count, once_for_all=True)
    step_alts = per_step("--alt", alts, count, once_for_all=True)
    job = []
    for index, command in enumerate(steps):
        target = step_targets[index]
        job.append({
            "target": "any" if target is None else parse_target(target),
            "do": command,
            "alt_do": step_alts[index],
            "timeout": step_timeouts[index],
            "retry_strategy": {"max_retries": step_retries[index] or 0},
        })
    return {"job": job, "priority": priority or 0}


def wait_options(after: tuple[str, ...], after_policy: str | None, at: str | None,
                 delay: str | None) -> Doc:
    """`--after` (repeatable), `--after-policy`, `--at TIME` or `--in DURATION` as the
    job fields they set (docs/job-document.md, "Waiting"); none given, none set."""
    if at is not None and delay is not None:
        raise BadOptions("give --at TIME or --in DURATION, not both")
    fields: Doc = {}
    if after:
        fields["after"] = list(after)
    if after_policy is not None:
        fields["after_policy"] = after_policy
    if at is not None:
        fields["not_before"] = parse_utc_time(at, "--at")
    if delay is not None:
        fields["not_before"] = later(utc_now(), parse_duration(delay).total_seconds())
    return fields


def parse_utc_time(text: str, option: str) -> str:
    """An ISO 8601 time with its zone (`2026-11-23T02:00Z`, `...T03:00+01:00`) in the
    document's form: UTC, ending in Z."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise BadOptions(f"{option} {text!r}: not an ISO 8601 time (e.g. 2026-11-23T02:00Z)") \
            from None
    if moment.tzinfo is None:
        raise BadOptions(f"{option} {text!r}: say which zone: end it in Z for UTC "
                         "(e.g. 2026-11-23T02:00Z) or give an offset (+01:00)")
    return format_time(moment.astimezone(UTC))


def unknown_targets(submission: Any, sites: Collection[str]) -> list[str]:
    """Steps that name a site the sites directory does not know: nobody could run them."""
    if not isinstance(submission, dict) or not isinstance(submission.get("job"), list):
        return []
    errors = []
    for index, step in enumerate(submission["job"]):
        target = step.get("target") if isinstance(step, dict) else None
        names = target if isinstance(target, list) else [target]
        unknown = [n for n in names if isinstance(n, str) and n not in (ANY, ALL)
                   and n not in sites]
        if unknown:
            errors.append(f"job[{index}].target: unknown site {', '.join(map(repr, unknown))}; "
                          f"known: {', '.join(sorted(sites))}")
    return errors


def read_job_file(file: str, file_format: str = "auto") -> Any:
    """A submission from a JSON or YAML file (`-`: stdin), as plain JSON values."""
    name = "<stdin>" if file == "-" else file  # what its errors say
    try:
        data = read_stdin() if file == "-" else Path(file).read_bytes()
    except OSError as error:
        raise UnreadableFile(f"{name}: cannot read: {error.strerror or error}") from None
    if holds_nothing(data):
        raise UnreadableFile(f"{name}: empty: no job in it (a job file holds an object with "
                             "its steps under `job`)")
    if file_format == "auto":
        file_format = guess_format(file, data)
    invalid = f"{name}: not valid {file_format.upper()}"
    try:
        text = data.decode("utf-8-sig")
        return parse_json(text) if file_format == "json" else parse_yaml(text)
    except UnicodeDecodeError:
        raise UnreadableFile(f"{invalid}: not UTF-8 text") from None
    except RecursionError:
        raise UnreadableFile(f"{invalid}: nested too deeply") from None
    except UnreadableFile as error:
        raise UnreadableFile(f"{name}: {error}") from None


def holds_nothing(data: bytes) -> bool:
    """Blank lines and YAML comments only: an empty job file, whatever its format."""
    text = data.decode("utf-8-sig", errors="replace")
    return all(not line.strip() or line.lstrip().startswith("#") for line in text.splitlines())


def read_stdin() -> bytes:
    """Standard input as bytes (click.get_binary_stream is deprecated in newer Click)."""
    if sys.stdin is None:  # started without one
        raise OSError("no standard input")
    return sys.stdin.buffer.read()


def guess_format(file: str, data: bytes) -> str:
    suffix = Path(file).suffix.lower() if file != "-" else ""
    if suffix == ".json":
        return "json"
    if suffix in (".yaml", ".yml"):
        return "yaml"
    start = data.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    return "json" if start in (b"{", b"[") else "yaml"


def parse_json(text: str) -> Any:
    try:
        value = json.loads(text, parse_constant=reject_constant)
    except ValueError as error:
        raise UnreadableFile(f"not valid JSON: {error}") from None
    problem = non_json_value(value)
    if problem:
        raise UnreadableFile(f"not valid JSON: {problem}")
    return value


def reject_constant(name: str) -> Any:
    # NaN and Infinity are not JSON: CouchDB would refuse them.
    raise ValueError(f"{name} is not a JSON value")


def parse_yaml(text: str) -> Any:
    import yaml

    try:
        value = yaml.load(text, Loader=job_yaml_loader())  # a SafeLoader
    except yaml.YAMLError as error:
        raise UnreadableFile(f"not valid YAML: {describe_yaml_error(error)}") from None
    problem = non_json_value(value)
    if problem:
        raise UnreadableFile(f"not a JSON value in YAML: {problem}")
    return value


def describe_yaml_error(error: Exception) -> str:
    """`line L, column C: problem (context)` on one line, without PyYAML's source excerpt."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None)
    if problem is None:
        return " ".join(str(error).split())
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context = getattr(error, "context", None)
    return " ".join(f"{where}{problem}{f' ({context})' if context else ''}".split())


def job_yaml_loader() -> type:
    """SafeLoader without timestamps: `2026-01-01` stays text, as in JSON."""
    import yaml

    class JobLoader(yaml.SafeLoader):
        pass

    JobLoader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers
                if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return JobLoader


def non_json_value(document: Any) -> str | None:
    """Where a value has something JSON cannot hold (a binary, a set, .nan, a lone
    surrogate...); UnreadableFile when YAML aliases repeat more values than a job may hold
    (each one at least a character of its JSON)."""
    pending: list[tuple[Any, str]] = [(document, "")]
    seen = 0
    while pending:
        seen += 1
        if seen > MAX_DOC_SIZE:
            raise UnreadableFile(f"too large: more than {MAX_DOC_SIZE} values, once its "
                                 "aliases are expanded (a job holds at most 1 MiB of JSON)")
        value, path = pending.pop()
        if problem := scalar_problem(value, path or "the document"):
            return problem
        if isinstance(value, list | dict):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            pending += reversed([(item, inner_path(path, key)) for key, item in items])
    return None


def scalar_problem(value: Any, where: str) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where}: {value} is not a JSON number"
    if isinstance(value, str):
        return surrogate_problem(value, where)
    if value is None or isinstance(value, bool | int | float | list):
        return None
    if not isinstance(value, dict):
        return f"{where}: a {type(value).__name__} is not a JSON value"
    for key in value:
        if not isinstance(key, str):
            return f"{where}: key {key!r} is not a string (quote it)"
        if problem := surrogate_problem(key, f"{where}: key"):
            return problem
    return None


def surrogate_problem(text: str, where: str) -> str | None:
    """JSON can spell a lone surrogate (\\ud800), but no text holds one: no shell could
    run it, nor a terminal show it."""
    lone = LONE_SURROGATE.search(text)
    return None if lone is None else f"{where}: {lone.group()!r} is a lone surrogate, not text"


def inner_path(path: str, key: str | int) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key
