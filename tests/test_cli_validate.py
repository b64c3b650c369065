"""`jobdist validate FILE`, in process (CliRunner) and as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from click.testing import CliRunner

from jobdist.cli import main
from jobdist.design import load_design_docs
from jobdist.validation import format_errors, validate_job, validate_submission

PROJECT_ROOT = Path(__file__).resolve().parent.parent

SUBMISSION = {"job": [{"target": ["site-a", "site-b"], "do": "make test", "timeout": 600}]}
BAD_SUBMISSION = {
    "priority": "high",
    "job": [{"target": [], "do": "", "retry_strategy": {"max_retries": -1}, "cmd": "ls"}],
}


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str


Jobdist = Callable[..., Run]


def run_in_process(args: list[str], stdin: str | None) -> Run:
    result = CliRunner().invoke(main, args, input=stdin)
    return Run(result.exit_code, result.stdout, result.stderr)


def run_as_process(args: list[str], stdin: str | None) -> Run:
    done = subprocess.run(
        [sys.executable, "-m", "jobdist.cli", *args],
        input=stdin, capture_output=True, text=True, timeout=30,
        # This checkout's jobdist, not whichever one is installed.
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
    )
    return Run(done.returncode, done.stdout, done.stderr)


@pytest.fixture(params=[run_in_process, run_as_process], ids=["runner", "process"])
def jobdist(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Jobdist:
    """Runs `jobdist ARGS` in a fresh working directory, both ways."""
    monkeypatch.chdir(tmp_path)

    def run(*args: str, stdin: str | None = None) -> Run:
        result = request.param(list(args), stdin)
        assert "Traceback" not in result.stdout + result.stderr
        return result

    return run


def write(name: str, content: Any) -> str:
    Path(name).write_text(content if isinstance(content, str) else json.dumps(content))
    return name


def test_a_good_submission_is_ok(jobdist: Jobdist) -> None:
    result = jobdist("validate", write("job.json", SUBMISSION))
    # No sites directory here: the sites it names are not checked, and it says so.
    assert (result.exit_code, result.stdout, result.stderr) == (
        0, "job.json: ok\n", "job.json: targets not checked: no sites directory sites/ here "
                             "(give --sites DIR or set $JOBDIST_SITES)\n")
    anywhere = {"job": [{"do": "make", "target": "any"}]}
    assert jobdist("validate", write("job.json", anywhere)).stderr == ""


def write_sites(*names: str) -> None:
    Path("sites").mkdir()
    for name in names:
        Path("sites", f"{name}.toml").write_text(
            f'name = "{name}"\n[couch]\nurl = "http://127.0.0.1:1"\n')


def test_targets_are_checked_against_the_sites_as_submit_checks_them(jobdist: Jobdist) -> None:
    write_sites("site-a", "site-c")
    result = jobdist("validate", write("job.json", SUBMISSION))
    refusal = "job[0].target: unknown site 'site-b'; known: site-a, site-c"
    assert (result.exit_code, result.stdout, result.stderr) == (2, f"job.json: {refusal}\n", "")
    # submit refuses it the same way, before it talks to any CouchDB.
    submitted = jobdist("submit", "job.json")
    assert (submitted.exit_code, submitted.stderr) == (2, f"jobdist: {refusal}\n")
    Path("sites", "site-b.toml").write_text('name = "site-b"\n[couch]\nurl = "http://127.0.0.1:1"\n')
    assert jobdist("validate", "job.json").stdout == "job.json: ok\n"


def test_a_sites_directory_given_must_exist(jobdist: Jobdist) -> None:
    result = jobdist("validate", write("job.json", SUBMISSION), "--sites", "nowhere")
    assert result.exit_code == 2
    assert result.stderr == ("jobdist: nowhere: no such sites directory "
                             "(give --sites DIR or set $JOBDIST_SITES)\n")


def test_a_bad_submission_lists_every_error(jobdist: Jobdist) -> None:
    result = jobdist("validate", write("job.json", BAD_SUBMISSION))
    expected = [f"job.json: {error}" for error in validate_submission(BAD_SUBMISSION)]
    assert result.exit_code == 2
    assert result.stdout.splitlines() == expected
    assert "job.json: priority: must be an integer" in expected
    assert "job.json: job[0].cmd: unknown field" in expected


def test_an_unknown_top_level_field_is_refused_with_a_hint(jobdist: Jobdist) -> None:
    content = "priorty: 5\nmeta: {ticket: OPS-1}\njob:\n  - do: make\n    target: any\n"
    result = jobdist("validate", write("job.yaml", content))
    assert (result.exit_code, result.stdout) == (
        2, "job.yaml: priorty: unknown field (did you mean 'priority'?)\n")
    fixed = jobdist("validate", write("job.yaml", content.replace("priorty", "priority")))
    assert (fixed.exit_code, fixed.stdout) == (0, "job.yaml: ok\n")


def test_stdin(jobdist: Jobdist) -> None:
    assert jobdist("validate", "-", stdin=json.dumps(SUBMISSION)).stdout == "<stdin>: ok\n"
    result = jobdist("validate", "-", stdin=json.dumps({"job": []}))
    assert (result.exit_code, result.stdout) == (
        2, "<stdin>: job: must be a non-empty list of steps\n"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"job": [', "job.json: not valid JSON: Expecting value: line 1 column 10 (char 9)"),
        ('{"priority": NaN}', "job.json: not valid JSON: NaN is not a JSON value"),
        ("[" * 100_000 + "]" * 100_000, "job.json: not valid JSON: nested too deeply"),
        (None, "job.json: cannot read: No such file or directory"),
    ],
    ids=["not-json", "nan", "deep", "missing"],
)
def test_an_unreadable_file_is_one_line_and_exit_2(
    jobdist: Jobdist, content: str | None, message: str
) -> None:
    if content is not None:
        write("job.json", content)
    result = jobdist("validate", "job.json")
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", message + "\n")


EMPTY = "empty: no job in it (a job file holds an object with its steps under `job`)"


@pytest.mark.parametrize("content", ["", "\n  \n", "# a job, some day\n\n"],
                         ids=["empty", "blank", "comments"])
def test_an_empty_file_is_said_to_be_empty(jobdist: Jobdist, content: str) -> None:
    for name in ("job.yaml", "job.json"):
        result = jobdist("validate", write(name, content))
        assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"{name}: {EMPTY}\n")
    assert jobdist("validate", "-", stdin=content).stderr == f"<stdin>: {EMPTY}\n"
    submitted = jobdist("submit", "job.yaml")
    assert (submitted.exit_code, submitted.stderr) == (2, f"jobdist: job.yaml: {EMPTY}\n")
    # A document that says null is not empty: it is not a job.
    null = jobdist("validate", write("job.yaml", "null\n"))
    assert null.stdout == "job.yaml: document: must be a JSON object\n"


def test_the_cli_and_couchdb_refuse_with_the_same_errors(db_url: str, tmp_path: Path) -> None:
    for design in load_design_docs():
        requests.put(f"{db_url}/{design['_id']}", json=design, timeout=10).raise_for_status()
    stored = {
        "_id": "job-1", "type": "job", "creator": "site-a", "priority": 0,
        "created_at": "2026-11-22T00:35:12.123456Z", "updated_at": "2026-11-22T00:35:12Z",
        "step": 0, "job_status": None, "history": [],
        **BAD_SUBMISSION,
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(stored))
    cli = CliRunner().invoke(main, ["validate", str(path)])
    couch = requests.put(f"{db_url}/job-1", json=stored, timeout=10)
    assert couch.status_code == 403
    cli_errors = [line.removeprefix(f"{path}: ") for line in cli.stdout.splitlines()]
    assert cli_errors == validate_job(stored)
    assert format_errors(cli_errors) == couch.json()["reason"]


def test_a_job_file_may_wait_for_jobs_and_a_time(jobdist: Jobdist) -> None:
    content = ("after: [job-a, job-b]\nafter_policy: always\nnot_before: '2026-11-24T02:00:00Z'\n"
               "job:\n  - do: verify-backups\n    target: global\n")
    result = jobdist("validate", write("job.yaml", content))
    assert (result.exit_code, result.stdout) == (0, "job.yaml: ok\n")
    bad = content.replace("job-b]", "job-a]").replace("always", "sometimes") \
        .replace("'2026-11-24T02:00:00Z'", "tomorrow")
    result = jobdist("validate", write("job.yaml", bad))
    assert result.exit_code == 2
    assert result.stdout.splitlines() == [
        "job.yaml: after[1]: duplicate job id",
        'job.yaml: after_policy: must be one of "success", "always"',
        "job.yaml: not_before: must be null or an ISO 8601 UTC time ending in Z "
        "(YYYY-MM-DDTHH:MM:SS[.ffffff]Z)",
    ]
