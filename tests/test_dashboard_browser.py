"""The dashboard in a real browser: Debian's headless Chromium, driven by Playwright
(`executable_path`: Playwright's own browser downloads are never used), against a
real local cluster of three sites whose `global` daemon serves the dashboard.

Jobs are submitted with the CLI, as an operator would. Every "without a reload"
check marks the page's window first and finds the mark still there at the end.
With $JOBDIST_SCREENSHOTS set to a directory, each page's screenshot is saved
there (docs/images/ holds the ones docs/operations.md shows).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Dialog, Page, expect, sync_playwright

from jobdist.client import read_merged
from jobdist.lab.cluster import LocalCluster
from jobdist.lab.localserver import free_port
from jobdist.lab.scenarios import site_db, write_sites
from jobdist.model import Doc

from .helpers import wait_for
from .test_fauxton import chromium

pytestmark = pytest.mark.e2e

expect.set_options(timeout=20_000)  # a loaded 2-core machine: pages may take seconds

TOKEN = "browser-test-token"
SITES = ("global", "reg_a", "reg_b")


class Cluster:
    def __init__(self, local: LocalCluster, sites_dir: Path, url: str) -> None:
        self.local, self.sites_dir, self.url = local, sites_dir, url

    def submit(self, *steps: str, target: str = "any") -> str:
        """Submit with the CLI at `global`; the job's id."""
        args = [sys.executable, "-m", "jobdist", "submit", "--sites", str(self.sites_dir),
                "--site", "global"]
        for step in steps:
            args += ["--step", step, "--target", target]
        done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    def job(self, job_id: str) -> Doc:
        return read_merged(site_db(self.local, "global"), "global", job_id)[0]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("dashboard-cluster")
    sites_dir = write_sites(root / "sites", 3, keepalive=2.0)
    port = free_port()
    with (sites_dir / "global.toml").open("a") as config:
        config.write(f'\n[admin]\nport = {port}\ntoken = "{TOKEN}"\n')
    with LocalCluster(sites_dir, root / "state", in_memory=True) as local:
        yield Cluster(local, sites_dir, f"http://127.0.0.1:{port}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as driver:
        launched = driver.chromium.launch(
            executable_path=chromium(),
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh tab in a fresh context: no token in its sessionStorage."""
    context = browser.new_context(viewport={"width": 1280, "height": 820})
    context.set_default_timeout(30_000)
    opened = context.new_page()
    try:
        yield opened
    finally:
        context.close()


def screenshot(page: Page, name: str) -> None:
    directory = os.environ.get("JOBDIST_SCREENSHOTS")
    if directory:
        page.screenshot(path=str(Path(directory) / f"dashboard-{name}.png"))


def mark(page: Page) -> None:
    page.evaluate("window.notReloaded = true")


def not_reloaded(page: Page) -> bool:
    return bool(page.evaluate("window.notReloaded === true"))


def use_token(page: Page) -> None:
    page.fill("#token", TOKEN)
    page.click("#login button")
    expect(page.locator("#logout")).to_be_visible()


def test_the_overview_shows_three_sites_and_their_workers(cluster: Cluster, page: Page) -> None:
    page.goto(cluster.url + "/")
    expect(page.locator("tr.site")).to_have_count(3)
    mark(page)
    for name in SITES:
        row = page.locator(f'tr.site[data-site="{name}"]')
        # Each site's workers: this site's own pool, the others' from their status
        # documents (filled in live as those arrive).
        expect(row.locator("td").nth(1)).to_have_text("2")
        expect(row.locator("td").nth(2)).not_to_have_text("-")
    expect(page.locator('tr.site.here[data-site="global"]')).to_be_visible()
    expect(page.locator(".feed.on")).to_be_visible()
    # Which workers are busy with what, at each site, as the steps start.
    jobs = {site: cluster.submit("sleep 6", target=site) for site in ("reg_a", "reg_b")}
    for site, job_id in jobs.items():
        running = page.locator(f'table.running tr[data-job="{job_id}"]')
        expect(running.locator("td").first).to_have_text(site, timeout=30_000)
        expect(running.locator("td").nth(1)).to_contain_text(f"{site}/w")
        expect(page.locator(f'tr.site[data-site="{site}"] td').nth(4)).not_to_have_text("0")
    assert not_reloaded(page)
    use_token(page)
    expect(page.locator("form.resize")).to_be_visible()
    screenshot(page, "overview")
    questions = answer_dialogs(page)
    page.fill("form.resize input", "3")
    page.click("form.resize button")
    expect(page.locator('tr.site.here td').nth(1)).to_have_text("3")
    assert questions == ["Resize the worker pool of global to 3?"]
    page.fill("form.resize input", "2")
    page.click("form.resize button")
    expect(page.locator('tr.site.here td').nth(1)).to_have_text("2")


def answer_dialogs(page: Page) -> list[str]:
    """Accept every confirmation the page asks for; the questions, as they come."""
    questions: list[str] = []

    def accept(dialog: Dialog) -> None:
        questions.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)
    return questions


def test_a_job_submitted_with_the_cli_moves_to_success_without_a_reload(
        cluster: Cluster, page: Page) -> None:
    page.goto(cluster.url + "/jobs")
    expect(page.locator(".feed.on")).to_be_visible()
    mark(page)
    job_id = cluster.submit("sleep 1", "sleep 1", "echo done")
    row = page.locator(f'tr.job[data-job="{job_id}"]')
    expect(row).to_be_visible()  # appears in the list without a reload
    page.click(f'a[href="/jobs/{job_id}"]')
    expect(page.locator("h2.job-id")).to_have_text(job_id)
    expect(page.locator(".feed.on")).to_be_visible()
    mark(page)
    expect(page.locator("#job-status")).to_have_text("success", timeout=60_000)
    expect(page.locator("tr.step.finished")).to_have_count(3)
    assert not_reloaded(page)
    screenshot(page, "job")
    page.goto(cluster.url + "/jobs")
    expect(page.locator(f'tr.job[data-job="{job_id}"] .status')).to_have_text("success")
    screenshot(page, "jobs")


def test_a_failed_job_shows_its_reason_and_output_as_text(cluster: Cluster, page: Page) -> None:
    job_id = cluster.submit("echo boom-output; printf '<script>window.pwned=1</script>' >&2; "
                            "exit 7")
    wait_for(lambda: cluster.job(job_id)["job_status"] == "failed", timeout=60)
    page.goto(f"{cluster.url}/jobs/{job_id}")
    expect(page.locator("#job-status")).to_have_text("failed")
    expect(page.locator("#failure")).to_contain_text("step 0")
    expect(page.locator("pre.stdout")).to_contain_text("boom-output")
    expect(page.locator("pre.stderr")).to_have_text("<script>window.pwned=1</script>")
    assert page.evaluate("window.pwned === undefined")
    screenshot(page, "failed")


def test_a_cancel_from_the_page_stops_the_running_steps_process(
        cluster: Cluster, page: Page, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    job_id = cluster.submit(f"echo $$ > {pid_file}; exec sleep 120")
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=60))
    page.goto(f"{cluster.url}/jobs/{job_id}")
    expect(page.locator("button[data-action]")).to_have_count(0)  # no token yet
    use_token(page)
    button = page.locator("button[data-action]")
    expect(button).to_have_text("Cancel job")
    questions = answer_dialogs(page)
    button.click()
    expect(page.locator("#job-status")).to_have_text("cancelled")
    assert questions == [f"Cancel job {job_id}? A running step's process is stopped."]
    wait_for(lambda: not process_alive(pid), timeout=30, what="the step's process stopped")
    history = cluster.job(job_id)["history"]
    assert any(entry["event"] == "cancelled" and entry["detail"] == "cancelled by the dashboard"
               for entry in history)
    # The site that ran the step records the kill as a second "cancelled" event.
    expect(page.locator(".timeline .cancelled", has_text="cancelled by the dashboard")
           ).to_have_count(1)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class ForgingPage(BaseHTTPRequestHandler):
    """Another origin's page whose form posts a cancel to the dashboard by itself."""

    target = ""

    def do_GET(self) -> None:
        body = (f'<form id="f" method="post" action="{self.target}"></form>'
                '<script>document.getElementById("f").submit()</script>').encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_without_the_token_no_actions_and_a_forged_post_is_refused(
        cluster: Cluster, page: Page) -> None:
    job_id = cluster.submit("sleep 120")
    try:
        page.goto(f"{cluster.url}/jobs/{job_id}")
        expect(page.locator("#job-status")).to_contain_text("live")
        expect(page.locator("button[data-action]")).to_have_count(0)
        page.goto(cluster.url + "/")
        expect(page.locator("tr.site")).to_have_count(3)
        expect(page.locator("form.resize")).to_have_count(0)
        ForgingPage.target = f"{cluster.url}/jobs/{job_id}/cancel"
        forger = ThreadingHTTPServer(("127.0.0.1", 0), ForgingPage)
        threading.Thread(target=forger.serve_forever, daemon=True).start()
        try:
            with page.expect_response(lambda r: r.url.endswith("/cancel")) as answer:
                page.goto(f"http://127.0.0.1:{forger.server_address[1]}/")
            assert answer.value.status == 403
        finally:
            forger.shutdown()
            forger.server_close()
        assert cluster.job(job_id)["job_status"] is None
    finally:
        subprocess.run([sys.executable, "-m", "jobdist", "cancel", job_id, "--sites",
                        str(cluster.sites_dir), "--site", "global"], capture_output=True,
                       timeout=60, check=False)
