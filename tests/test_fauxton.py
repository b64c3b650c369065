"""Fauxton, the dashboard at a site's /_utils, shows our jobs and views (headless Chromium).

A real pouchdb-server with the `jobs` database, our design documents and a few
jobs; Debian's `chromium` loads the single-page app, runs it (a virtual-time
budget lets it render) and dumps the DOM, where we look for the rows Fauxton
drew: the database's title, each job's row in All Documents and in the
`by_status` view, with the view's key.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from jobdist.couch import Couch
from jobdist.couch_sync import sync_design_docs
from jobdist.design import load_design_docs
from jobdist.lab.localserver import LocalServer, free_port
from jobdist.model import new_job, new_step

INSTALL_HINT = ("headless Chromium is needed for the Fauxton test: install Debian's package "
                "with `apt-get update && apt-get install -y --no-install-recommends "
                "chromium` (the README's test command does), or point $JOBDIST_CHROMIUM at "
                "a chromium binary")
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--virtual-time-budget=15000",
)


def chromium() -> str:
    found = os.environ.get("JOBDIST_CHROMIUM") or shutil.which("chromium")
    if not found or not Path(found).exists():
        pytest.fail(INSTALL_HINT, pytrace=False)
    return found


def dump_dom(url: str, profile: Path, timeout: float = 120.0) -> str:
    """The DOM after the page's scripts ran, as Chromium serialises it."""
    args = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url]
    process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        # Chromium's helpers share its session: stop whatever of it is left, by its group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == 0, f"chromium failed: {err.decode(errors='replace')[-2000:]}"
    return out.decode("utf-8", errors="replace")


class FauxtonPage(HTMLParser):
    """The parts of a Fauxton page we check: the database title and the document rows."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.title = ""
        self.rows: dict[str, str] = {}  # data-id of each div.doc-row -> the row's text
        self._row: str | None = None
        self._depth = 0  # open divs inside the current row
        self._in_title = False
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        fields = dict(attrs)
        classes = (fields.get("class") or "").split()
        if tag == "div" and "faux-header__doc-header-title" in classes:
            self._in_title = True
        if tag != "div":
            return
        if self._row is not None:
            self._depth += 1
        elif "doc-row" in classes and fields.get("data-id"):
            self._row, self._depth = fields["data-id"], 1
            self.rows[self._row] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag != "div":
            return
        self._in_title = False
        if self._row is not None:
            self._depth -= 1
            if self._depth == 0:
                self._row = None

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data.strip()
        if self._row is not None:
            self.rows[self._row] += data


PROGRESS = {"fraction": 0.5, "message": "halfway", "at": "2026-11-23T00:00:00Z"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalServer, dict[str, str]]]:
    server = LocalServer(free_port(), tmp_path_factory.mktemp("fauxton"), in_memory=True)
    server.start()
    try:
        db = Couch(server.url).ensure_database("jobs")
        sync_design_docs(db, load_design_docs())
        jobs = [new_job("global", [new_step(f"echo {n}")]) for n in range(3)]
        jobs[2]["job"][0].update(  # running at reg_a, halfway
            epoch=1, claimed_by="reg_a", winner="reg_a", step_status="running",
            executioner="reg_a/w1", start_time=jobs[2]["created_at"], progress=PROGRESS)
        db.bulk_docs(jobs)
        yield server, {job["_id"]: job["created_at"] for job in jobs}
    finally:
        server.stop()


def test_all_documents_shows_the_jobs(site: tuple[LocalServer, dict[str, str]],
                                      tmp_path: Path) -> None:
    server, job_ids = site
    page = FauxtonPage(dump_dom(f"{server.url}/_utils/#database/jobs/_all_docs",
                                tmp_path / "profile"))
    assert page.title == "jobs"
    assert set(page.rows) == {*job_ids, "_design/jobdist", "_design/jobdist_people"}
    for job_id in job_ids:
        assert f'"{job_id}"' in page.rows[job_id]


def test_the_by_status_view_shows_its_rows(site: tuple[LocalServer, dict[str, str]],
                                           tmp_path: Path) -> None:
    server, jobs = site
    url = f"{server.url}/_utils/#database/jobs/_design/jobdist_people/_view/by_status"
    page = FauxtonPage(dump_dom(url, tmp_path / "profile"))
    assert page.title == "jobs"
    assert set(page.rows) == set(jobs)  # the view's rows, not the design document
    for job_id, created_at in jobs.items():
        row = "".join(page.rows[job_id].split())
        assert f'"key":["live","{created_at}"]' in row, row  # the view's key: status, age
        assert f'"id":"{job_id}"' in row


def test_the_running_view_shows_the_steps_progress(site: tuple[LocalServer, dict[str, str]],
                                                   tmp_path: Path) -> None:
    server, jobs = site
    url = f"{server.url}/_utils/#database/jobs/_design/jobdist_people/_view/running"
    page = FauxtonPage(dump_dom(url, tmp_path / "profile"))
    [(job_id, text)] = page.rows.items()  # the one running step
    row = "".join(text.split())
    assert f'"key":["reg_a","{jobs[job_id]}"]' in row, row
    assert '"progress":{"fraction":0.5,"message":"halfway"' in row, row


def test_the_parser_reads_nested_rows() -> None:
    page = FauxtonPage('<div class="faux-header__doc-header-title x">jobs</div>'
                       '<div data-id="a" class="doc-row"><div><span>"a"</span></div>'
                       '<div>key</div></div><div>outside</div>')
    assert page.title == "jobs"
    assert page.rows == {"a": '"a"key'}
