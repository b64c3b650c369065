"""A hostile but ordinary operator at the command line, against a real server: each
bad input is one `jobdist: ...` line on stderr and a non-zero exit, never a
traceback, and nothing half-written."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from jobdist.lab.localserver import LocalServer
from jobdist.model import new_job, new_step

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Done:
    code: int
    stdout: str
    stderr: str


@dataclass
class Site:
    """One site on the session's server, set up (its database and views)."""

    sites_dir: Path
    db_url: str

    def run(self, *args: str, stdin: str | None = None, timeout: float = 60) -> Done:
        done = subprocess.run([sys.executable, "-m", "jobdist", *args], input=stdin,
                              capture_output=True, text=True, timeout=timeout,
                              cwd=self.sites_dir.parent, env=self.env())
        assert "Traceback" not in done.stdout + done.stderr, done.stderr
        return Done(done.returncode, done.stdout, done.stderr)

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "jobdist", *args], text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=self.sites_dir.parent, env=self.env())

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(PROJECT_ROOT),
                "JOBDIST_SITES": str(self.sites_dir), "JOBDIST_SITE": "global"}

    def job_ids(self) -> list[str]:
        rows = requests.get(f"{self.db_url}/_all_docs", timeout=10).json()["rows"]
        return [row["id"] for row in rows if row["id"].startswith("job-")]


@pytest.fixture
def site(couch_server: LocalServer, tmp_path: Path) -> Iterator[Site]:
    database = f"t_{uuid.uuid4().hex[:12]}"
    sites_dir = tmp_path / "sites"
    sites_dir.mkdir()
    (sites_dir / "global.toml").write_text(
        f'name = "global"\n[couch]\nurl = "{couch_server.url}"\ndatabase = "{database}"\n'
        f'[daemon]\njournal = "{tmp_path / "journal"}"\n')
    found = Site(sites_dir, f"{couch_server.url}/{database}")
    assert found.run("setup").code == 0
    try:
        yield found
    finally:
        requests.delete(found.db_url, timeout=10)


def one_line(done: Done, *fragments: str, code: int = 2) -> str:
    assert done.code == code, done
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobdist: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# --- what a job holds --------------------------------------------------------------------


def test_a_job_with_a_lone_surrogate_is_refused_and_nothing_is_written(site: Site,
                                                                         tmp_path: Path) -> None:
    """JSON may spell one (\\ud800), but no text holds it: no step could ever run."""
    path = tmp_path / "job.json"
    path.write_text('{"job": [{"do": "echo \\ud800", "target": "any"}]}')
    one_line(site.run("submit", str(path)), f"{path}: not valid JSON: job[0].do:",
             "lone surrogate")
    one_line(site.run("submit", "--step", "echo \udcff"), "--step", "lone surrogate")
    assert site.job_ids() == []


def test_a_stored_job_with_a_lone_surrogate_is_shown_and_listed(site: Site) -> None:
    """Written by someone else over HTTP, it must not break `show` or `list`."""
    job = new_job("global", [new_step("echo \ud800")], job_id="job-odd")
    requests.put(f"{site.db_url}/job-odd", data=json.dumps(job),
                 headers={"Content-Type": "application/json"}, timeout=10).raise_for_status()
    for args in (("show", "job-odd"), ("show", "job-odd", "--json"), ("list",)):
        done = site.run(*args)
        assert done.code == 0, done.stderr
        assert "echo \\ud800" in done.stdout
    assert json.loads(site.run("show", "job-odd", "--json").stdout)["job"][0]["do"] \
        == "echo \ud800"


def test_a_yaml_file_whose_aliases_explode_is_refused_at_once(site: Site,
                                                              tmp_path: Path) -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]" for n in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join([*lines, "job: [{do: 'true', target: any}]", ""]))
    started = time.monotonic()
    for args in (("submit", str(path)),
                 ("schedule", "add", "nightly", str(path), "--cron", "0 2 * * *")):
        one_line(site.run(*args, timeout=30), f"jobdist: {path}: too large")
    validated = site.run("validate", str(path), timeout=30)  # `FILE: problem`, as a linter
    assert (validated.code, validated.stdout) == (2, "")
    assert validated.stderr.startswith(f"{path}: too large: more than 1048576 values")
    assert time.monotonic() - started < 20
    assert site.job_ids() == []


# --- options out of range ------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ("submit", "--step", "true", "--in", "99999999999999999999d"),
    ("submit", "--step", "true", "--in", "9999999d"),
    ("cleanup", "--older-than", "99999999999999999999d"),
    ("cleanup", "--older-than", "9999999d", "--dry-run"),
])
def test_a_duration_too_long_is_refused(site: Site, args: tuple[str, ...]) -> None:
    one_line(site.run(*args), "too long")
    assert site.job_ids() == []


@pytest.mark.parametrize("args", [
    ("list", "--limit", "99999999999999999999999"),
    ("watch", "--interval", "nan"),
    ("watch", "--interval", "inf"),
    ("submit", "--step", "true", "--timeout", "nan"),
])
def test_an_option_out_of_range_is_refused(site: Site, args: tuple[str, ...]) -> None:
    one_line(site.run(*args), f"{args[-2]}")
    assert site.job_ids() == []


# --- site configs -------------------------------------------------------------------------


@pytest.mark.parametrize(("setting", "message"), [
    ('retention]\nolder_than = "99999999999999999999d"', "retention.older_than: "),
    ('retention]\ninterval = nan', "retention.interval: must be a finite number"),
    ('tuning]\nkeepalive_period = inf', "tuning.keepalive_period: must be a finite number"),
    ('admin]\nport = 99999999', "admin.port: must be a port (0-65535"),
])
def test_a_config_value_out_of_range_is_refused(site: Site, setting: str, message: str) -> None:
    config = site.sites_dir / "global.toml"
    config.write_text(f"{config.read_text()}[{setting}\n")
    one_line(site.run("list"), f"{config}: {message}")


@pytest.mark.parametrize("url", ["http://[::1", "not a url", "ftp://127.0.0.1:5984",
                                 "http://127.0.0.1:99999"])
def test_a_config_with_a_bad_url_is_refused(site: Site, url: str) -> None:
    config = site.sites_dir / "global.toml"
    text = config.read_text()
    start = text.index('url = "') + len('url = "')
    config.write_text(text[:start] + url + text[text.index('"', start):])
    one_line(site.run("list"), f"{config}: couch.url: ", "http")


def test_a_config_that_is_not_text_is_refused(site: Site) -> None:
    config = site.sites_dir / "global.toml"
    config.write_bytes(b"\xff\xfe\x00name")
    one_line(site.run("list"), f"{config}: cannot read site config: not UTF-8 text")


# --- Ctrl-C ---------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [("submit", "--step", "true", "--wait"), ("show", "job-1"),
                                  ("watch", "--once")])
def test_ctrl_c_while_the_server_does_not_answer_is_one_line(tmp_path: Path,
                                                             args: tuple[str, ...]) -> None:
    """Whenever it comes: not Click's bare `Aborted!` and exit 1 (for `submit --wait`,
    the code of a job that failed)."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        sites_dir = tmp_path / "sites"
        sites_dir.mkdir()
        (sites_dir / "global.toml").write_text(
            f'name = "global"\n[couch]\nurl = "http://127.0.0.1:{silent.getsockname()[1]}"\n')
        process = Site(sites_dir, "").start(*args)
        time.sleep(3)  # waiting for the answer
        os.kill(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert out == "" and err == "jobdist: interrupted\n"
