"""The dashboard over HTTP on a real daemon: a real pouchdb-server, real steps, real
requests (the browser tests are tests/test_dashboard_browser.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from jobdist import dashboard
from jobdist.admin import AdminServer
from jobdist.client import site_database
from jobdist.config import CouchSettings, SiteConfig
from jobdist.daemon import Daemon
from jobdist.hub import MAX_CLIENTS, MAX_IDS, ChangeHub
from jobdist.lab.localserver import free_port
from jobdist.model import Doc, new_job, new_step

from .helpers import conflicting_leaves, daemon_with_admin, wait_for, write_conflict

TOKEN = "dashboard-admin-token"
SITE = "solo"


class Running:
    """The site under test: its daemon, its admin endpoint's address, its database."""

    def __init__(self, daemon: Daemon) -> None:
        assert daemon.admin is not None
        self.daemon, self.admin, self.db = daemon, daemon.admin, daemon.db
        self.url = self.admin.url


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """One site: its server and its daemon, the admin endpoint on a free port."""
    with daemon_with_admin(tmp_path_factory.mktemp("dashboard"), SITE, 2, TOKEN) as daemon:
        running = Running(daemon)
        running.admin.dashboard.heartbeat = 0.5  # streams notice a gone client soon
        yield running


def submit(site: Running, *commands: str) -> str:
    job = new_job(SITE, [new_step(command) for command in commands])
    site.db.save(job)
    return str(job["_id"])


def job_doc(site: Running, job_id: str) -> Doc:
    doc = site.db.get(job_id)
    assert doc is not None
    return doc


def ended(site: Running, job_id: str) -> Doc:
    return wait_for(lambda: (doc := job_doc(site, job_id))["job_status"] and doc,
                    what=f"{job_id} ends")


def get(site: Running, path: str, token: str | None = None, **headers: str) -> requests.Response:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return requests.get(f"{site.url}{path}", headers=headers, timeout=10,
                        allow_redirects=False)


def post(site: Running, path: str, body: Any = None, token: str | None = TOKEN,
         **headers: str) -> requests.Response:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return requests.post(f"{site.url}{path}", json=body or {}, headers=headers, timeout=10)


def test_the_overview_shows_the_site_its_workers_and_running_steps(site: Running) -> None:
    job_id = submit(site, "sleep 30")
    try:
        wait_for(lambda: job_id in get(site, "/").text, what="the running step shown")
        resp = get(site, "/")
        assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/html")
        assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
        page = resp.text
        assert f'data-site="{SITE}"' in page and "(this site)" in page
        assert "sleep 30" in page and f'href="/jobs/{job_id}"' in page
        assert "Resize pool" not in page  # no token: no actions
        assert TOKEN not in page
    finally:
        post(site, f"/jobs/{job_id}/cancel")


def test_a_running_steps_progress_is_shown(site: Running) -> None:
    job_id = submit(site, "echo 'JOBDIST_PROGRESS 0.4 copying volume 3'; sleep 30")
    try:
        wait_for(lambda: "40% copying volume 3" in get(site, "/").text, timeout=30,
                 what="the progress on the overview")
        assert "40% copying volume 3" in get(site, f"/jobs/{job_id}").text
    finally:
        post(site, f"/jobs/{job_id}/cancel")


def test_with_the_token_a_fragment_offers_actions(site: Running) -> None:
    resp = get(site, "/?fragment=1", token=TOKEN)
    assert resp.status_code == 200
    assert "Resize pool" in resp.text and "<html" not in resp.text
    assert TOKEN not in resp.text
    assert get(site, "/?fragment=1", token="wrong").status_code == 403


def test_a_job_page_shows_steps_output_and_history_escaped(site: Running) -> None:
    job_id = submit(site, "printf '<script>alert(1)</script>'", "echo oops >&2; exit 3")
    doc = ended(site, job_id)
    assert doc["job_status"] == "failed"
    page = get(site, f"/jobs/{job_id}").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert" not in page
    assert 'class="failure"' in page and "step 1" in page  # the reason
    assert "oops" in page  # the failed step's stderr tail
    for event in ("created", "started", "finished", "failed"):
        assert f"<b>{event}</b>" in page, event
    assert "conflicting revision" not in page


def test_a_failure_reason_keeps_its_closing_parenthesis(site: Running) -> None:
    job = new_job(SITE, [new_step("exit 3", alt_do="exit 1")])
    site.db.save(job)
    assert ended(site, job["_id"])["job_status"] == "failed"
    page = get(site, f"/jobs/{job['_id']}").text
    assert ">step 0: alt_do failed (exit 1) after do failed (exit 3)</dd>" in page


def test_steps_after_the_current_one_are_not_started_not_waiting(site: Running) -> None:
    job = new_job(SITE, [new_step("true"), new_step("true")],
                  waits={"not_before": "2099-01-01T00:00:00Z"})
    site.db.save(job)
    try:
        page = get(site, f"/jobs/{job['_id']}").text
        assert '<span class="status not-started">not started</span>' in page
        assert 'class="status waiting"' not in page
    finally:
        post(site, f"/jobs/{job['_id']}/cancel")


def test_a_site_whose_couchdb_is_down_shows_one_line_and_503(site: Running) -> None:
    down = SiteConfig(SITE, CouchSettings(f"http://127.0.0.1:{free_port()}"))  # nobody there
    board = dashboard.Dashboard(down, frozenset({SITE}), site.daemon.changes,
                                site_database(down, quick=True), site.daemon.status,
                                writes=False)
    for template, view in (("overview.html", board.overview), ("jobs.html", board.jobs),
                           ("job.html", board.job)):
        reply = board.page(template, view, dashboard.Request("job-x", {"fragment": "1"}))
        assert reply.status == 503, template
        text = reply.body.decode().strip()
        assert text == (f'<p class="missing">cannot reach the CouchDB of site {SITE} at '
                        f'{down.couch.url}: connection refused (is it running? '
                        '`jobdist cluster status` shows the local sites)</p>'), text


def test_a_job_with_conflicts_is_shown_merged(site: Running) -> None:
    open_leaf, done_leaf = conflicting_leaves()
    write_conflict(site.db, [open_leaf, done_leaf])
    page = get(site, f"/jobs/{open_leaf['_id']}").text
    assert "1 conflicting revision, merged" in page
    assert 'id="job-status" class="status success">success<' in page
    assert "<b>finished</b> step 0 at nowhere" in page


def test_the_list_filters_and_pages_newest_first(site: Running,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    ids = [submit(site, "true") for _ in range(3)]
    docs = [ended(site, job_id) for job_id in ids]
    newest = [doc["_id"] for doc in sorted(docs, key=lambda d: (d["created_at"], d["_id"]),
                                           reverse=True)]
    monkeypatch.setattr(dashboard, "PAGE_SIZE", 2)
    first = get(site, "/jobs?status=success").text
    assert '<option value="success" selected>' in first
    assert shown_jobs(first)[:2] == newest[:2]
    older = first.split('class="older" href="')[1].split('"')[0].replace("&amp;", "&")
    assert "status=success" in older and "before=" in older
    assert newest[2] in shown_jobs(get(site, older).text)
    assert get(site, "/jobs?status=nonsense").status_code == 400
    assert 'data-job="' not in get(site, "/jobs?creator=nobody").text


def shown_jobs(page: str) -> list[str]:
    return [part.split('"')[0] for part in page.split('data-job="')[1:]]


def test_search_by_id_and_an_unknown_job(site: Running) -> None:
    resp = get(site, "/jobs?id=job-123")
    assert resp.status_code == 303 and resp.headers["Location"] == "/jobs/job-123"
    missing = get(site, "/jobs/no-such-job")
    assert missing.status_code == 404 and "no job &#39;no-such-job&#39;" in missing.text
    assert get(site, "/static/nothing.js").status_code == 404
    script = get(site, "/static/dashboard.js")
    assert script.status_code == 200 and "EventSource" in script.text


def read_events(resp: requests.Response, wanted: str, limit: int = 200) -> dict[str, Any]:
    """The first `change` event whose ids name `wanted` (or say "many")."""
    event = None
    for count, line in enumerate(resp.iter_lines(chunk_size=1, decode_unicode=True)):
        assert count < limit, "no such event"
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: ") and event == "change":
            change = json.loads(line.removeprefix("data: "))
            if change["ids"] is None or wanted in change["ids"]:
                return dict(change)
    raise AssertionError("the stream ended")


def test_the_event_stream_tells_of_changes(site: Running) -> None:
    with requests.get(f"{site.url}/events", stream=True, timeout=10) as resp:
        assert resp.status_code == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        wait_for(lambda: site.daemon.changes.clients >= 1)
        job_id = submit(site, "true")
        change = read_events(resp, job_id)
        assert change["seq"] is not None


def test_event_streams_are_bounded_and_released(site: Running) -> None:
    hub = site.daemon.changes
    wait_for(lambda: hub.clients == 0, what="the earlier tests' streams released")
    hub.max_clients = 2
    try:
        first = requests.get(f"{site.url}/events", stream=True, timeout=10)
        second = requests.get(f"{site.url}/events", stream=True, timeout=10)
        wait_for(lambda: hub.clients == 2)
        third = requests.get(f"{site.url}/events", stream=True, timeout=10)
        assert third.status_code == 503 and "too many" in third.json()["error"]
        first.close()
        second.close()
        # The next heartbeat's write fails: the handler threads end, the slots are free.
        wait_for(lambda: hub.clients == 0, timeout=10, what="streams released")
    finally:
        hub.max_clients = MAX_CLIENTS


def test_forged_posts_are_refused(site: Running) -> None:
    job_id = submit(site, "sleep 30")
    try:
        assert post(site, f"/jobs/{job_id}/cancel", token=None).status_code == 401
        assert post(site, f"/jobs/{job_id}/cancel", token="guess").status_code == 403
        cross = post(site, f"/jobs/{job_id}/cancel", Origin="http://evil.example")
        assert cross.status_code == 403 and "cross-site" in cross.json()["error"]
        assert post(site, f"/jobs/{job_id}/cancel",
                    **{"Sec-Fetch-Site": "cross-site"}).status_code == 403
        assert post(site, "/workers", {"size": 7}, Origin="http://evil.example").status_code \
            == 403
        assert job_doc(site, job_id)["job_status"] is None
    finally:
        post(site, f"/jobs/{job_id}/cancel")


def test_cancel_with_the_token_stops_the_step_and_is_in_the_history(site: Running) -> None:
    job_id = submit(site, "sleep 60")
    wait_for(lambda: job_doc(site, job_id)["job"][0]["step_status"] == "running")
    resp = post(site, f"/jobs/{job_id}/cancel", Origin=site.url)
    assert resp.status_code == 200 and resp.json()["cancelled"] is True
    doc = job_doc(site, job_id)
    assert doc["job_status"] == "cancelled"
    cancel = next(entry for entry in doc["history"] if entry["event"] == "cancelled")
    assert cancel["detail"] == dashboard.CANCEL_REASON and cancel["site"] == SITE
    # The daemon kills the step: its run is recorded as failed and the worker is free.
    wait_for(lambda: job_doc(site, job_id)["job"][0]["step_status"] == "failed",
             what="the step's process stopped")
    again = post(site, f"/jobs/{job_id}/cancel")
    assert again.status_code == 200 and again.json()["cancelled"] is False
    assert post(site, "/jobs/no-such-job/cancel").status_code == 404


def test_no_token_configured_offers_no_actions_and_refuses_writes(site: Running) -> None:
    admin = AdminServer(site.daemon, "127.0.0.1", 0, token=None)
    admin.start()
    hub = site.daemon.changes
    stream = requests.get(f"{admin.url}/events", stream=True, timeout=10)
    try:
        wait_for(lambda: hub.clients >= 1, what="the stream subscribed")
        page = requests.get(f"{admin.url}/?fragment=1", timeout=10,
                            headers={"Authorization": f"Bearer {TOKEN}"})
        assert page.status_code == 200 and "Resize pool" not in page.text
        whole = requests.get(f"{admin.url}/", timeout=10).text
        assert 'id="login"' not in whole and "Actions off: this site has no admin token" in whole
        assert 'id="login"' in get(site, "/").text  # (a site with a token offers the field)
        job_id = submit(site, "true")
        resp = requests.post(f"{admin.url}/jobs/{job_id}/cancel", timeout=10,
                             headers={"Authorization": f"Bearer {TOKEN}"})
        assert resp.status_code == 403 and "no admin token" in resp.json()["error"]
    finally:
        admin.stop()
    # Stopping the endpoint ends its event streams: no thread is left waiting.
    wait_for(lambda: hub.clients == 0, timeout=5, what="the stream ended")
    assert b"connected" in b"".join(stream.iter_content(chunk_size=None))


def test_the_hub_tells_a_reader_what_changed_until_too_much() -> None:
    hub = ChangeHub(max_clients=1)
    assert hub.join() and not hub.join()
    seen = hub.published
    hub.publish("a", 1)
    hub.publish("a", 2)
    seen, change = hub.read(seen, 0.1, stop=lambda: False)
    assert change == {"ids": ["a"], "seq": 2}
    assert hub.read(seen, 0.01, stop=lambda: False) == (seen, None)
    for n in range(MAX_IDS + 1):
        hub.publish(f"job-{n}", n)
    seen, change = hub.read(seen, 0.1, stop=lambda: False)
    assert change == {"ids": None, "seq": MAX_IDS}  # many: the page reloads what it shows
    hub.publish("b", 3)
    assert hub.read(seen, 0.1, stop=lambda: False) == (seen + 1, {"ids": ["b"], "seq": 3})
    hub.leave()
    assert hub.clients == 0 and hub.join()


def test_a_broadcast_step_shows_a_row_per_site(site: Running) -> None:
    job = new_job(SITE, [new_step("echo snapshot-$JOBDIST_SITE", target="all")])
    site.db.save(job)
    doc = ended(site, job["_id"])
    assert doc["job_status"] == "success"
    page = get(site, f"/jobs/{job['_id']}").text
    assert "1/1 sites" in page  # where: the fan-out
    row = re.search(r'<tr class="sub-run finished">.*?</tr>', page, re.DOTALL)
    assert row is not None and f"at {SITE}" in row[0]
    assert re.search(r"<td>\d+\.\ds</td>", row[0]), row[0]  # TOOK
    # Each site's output, under its name (the step's own holds none).
    section = re.search(r'<details class="output" data-step="0" data-site="solo" open>.*?'
                        r"</details>", page, re.DOTALL)
    assert section is not None and f"step 0 output at {SITE}" in section[0]
    assert f'<pre class="stdout">snapshot-{SITE}\n</pre>' in section[0]


def test_a_waiting_job_page_says_what_it_waits_for(site: Running) -> None:
    first = submit(site, "true")
    ended(site, first)
    job = new_job(SITE, [new_step("true")],
                  waits={"after": [first, "job-<missing>"], "not_before": "2099-01-01T00:00:00Z"})
    site.db.save(job)
    page = get(site, f"/jobs/{job['_id']}").text
    assert 'class="status live">waiting (its creator starts it when the wait is over)<' in page
    assert f'<a href="/jobs/{first}">{first}</a> (success)' in page
    assert "job-&lt;missing&gt;</a> (not seen here) · policy success" in page
    assert "2099-01-01T00:00:00Z (its creator's clock)" in page
    listing = get(site, "/jobs?status=waiting").text
    assert job["_id"] in listing and first not in listing
    assert post(site, f"/jobs/{job['_id']}/cancel").status_code == 200
