"""The admin endpoint on a real daemon: a real pouchdb-server, a running step, real HTTP."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from jobdist.admin import AdminServer, SiteCollector, resident_memory_bytes
from jobdist.config import ConfigError
from jobdist.couch import Couch
from jobdist.daemon import Daemon
from jobdist.lab.localserver import free_port
from jobdist.listener import seq_number
from jobdist.model import new_job, new_step

from .helpers import daemon_with_admin, wait_for

TOKEN = "s3cret-admin-token"
SITE = "solo"


@dataclasses.dataclass
class Running:
    daemon: Daemon
    url: str
    job_id: str


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """One site: its server, its daemon (admin on a free port) and a job running `sleep 60`."""
    with daemon_with_admin(tmp_path_factory.mktemp("admin"), SITE, 1, TOKEN) as daemon:
        assert daemon.admin is not None
        job = new_job(SITE, [new_step("sleep 60")])  # the drain stops it
        daemon.db.save(job)
        yield Running(daemon, daemon.admin.url, job["_id"])


def status(site: Running) -> dict[str, Any]:
    resp = requests.get(f"{site.url}/status", timeout=5)
    resp.raise_for_status()
    return resp.json()


def post(site: Running, path: str, body: Any = None, token: str | None = TOKEN,
         data: bytes | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return requests.post(f"{site.url}{path}", json=body if data is None else None, data=data,
                         headers=headers, timeout=5)


def test_binds_loopback_on_a_free_port(site: Running) -> None:
    assert site.url.startswith("http://127.0.0.1:")
    assert site.daemon.admin is not None and site.daemon.admin.port > 0


def test_status_shows_the_running_step(site: Running) -> None:
    # The step may start from a claimable scan before the feed brings its change.
    answer = wait_for(lambda: (s := status(site))["workers"]["busy"] == 1
                      and s["feed"]["seq"] is not None and s)
    assert answer["site"] == SITE
    assert answer["workers"]["size"] >= 1
    assert set(answer["workers"]) == {"size", "free", "booked", "busy"}
    assert answer["draining"] is False
    running = next(r for r in answer["running"] if r["job_id"] == site.job_id)
    assert running["step"] == 0 and running["epoch"] >= 1
    assert running["worker"].startswith(f"{SITE}/w") and running["seconds"] >= 0
    assert answer["feed"]["seq"] is not None and answer["feed"]["queued"] >= 0
    assert answer["uptime_seconds"] > 0
    assert answer["memory_bytes"] > 1_000_000
    assert answer["counts"]["steps_started"] >= 1
    assert TOKEN not in requests.get(f"{site.url}/status", timeout=5).text


def metrics(site: Running) -> dict[str, float]:
    resp = requests.get(f"{site.url}/metrics", timeout=5)
    resp.raise_for_status()
    assert resp.headers["Content-Type"].startswith("text/plain")
    values = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "site")
            values[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
            if "site" in sample.labels:
                assert sample.labels["site"] == SITE
    return values


def test_metrics_parse_and_count_the_step(site: Running) -> None:
    wait_for(lambda: status(site)["workers"]["busy"] == 1)
    values = metrics(site)
    assert values["jobdist_steps_started_total"] >= 1
    assert values["jobdist_workers{state=busy}"] == 1
    for name in ("steps_finished", "steps_failed", "claims_made", "claims_won", "claims_lost",
                 "conflicts_resolved", "keepalive_resaves", "write_conflicts",
                 "invalid_documents", "starts_deferred"):
        assert values[f"jobdist_{name}_total"] >= 0
    assert values["jobdist_decisions_total{action=start}"] >= 1
    assert values["jobdist_couch_up"] == 1
    assert values["jobdist_feed_lag"] >= 0
    assert values["jobdist_keepalive_left_for_room"] >= 0
    assert values["process_resident_memory_bytes"] > 0
    assert values["jobdist_uptime_seconds"] > 0


@pytest.mark.parametrize(("token", "expected"), [(None, 401), ("", 401), ("wrong", 403)])
def test_writes_need_the_token(site: Running, token: str | None, expected: int) -> None:
    size = status(site)["workers"]["size"]
    resp = post(site, "/workers", {"size": size + 5}, token=token)
    assert resp.status_code == expected
    assert "error" in resp.json() and TOKEN not in resp.text
    assert status(site)["workers"]["size"] == size


def test_a_read_with_a_wrong_token_is_refused(site: Running) -> None:
    wrong = requests.get(f"{site.url}/status", headers={"Authorization": "Bearer wrong"},
                         timeout=5)
    assert wrong.status_code == 403 and TOKEN not in wrong.text
    right = requests.get(f"{site.url}/status", headers={"Authorization": f"Bearer {TOKEN}"},
                         timeout=5)
    assert right.status_code == 200


def test_resize_the_pool(site: Running) -> None:
    resp = post(site, "/workers", {"size": 3})
    assert resp.status_code == 200
    assert resp.json()["workers"]["size"] == 3
    answer = status(site)
    assert answer["workers"]["size"] == 3
    assert answer["workers"]["free"] + answer["workers"]["busy"] + \
        answer["workers"]["booked"] == 3
    assert metrics(site)["jobdist_workers_size"] == 3
    # Shrinking below the busy slots never kills the running step.
    assert post(site, "/workers", {"size": 0}).status_code == 200
    answer = status(site)
    assert answer["workers"]["size"] == 0
    assert any(r["job_id"] == site.job_id for r in answer["running"])
    assert post(site, "/workers", {"size": 1}).status_code == 200


def test_change_the_keepalive_period(site: Running) -> None:
    resp = post(site, "/keepalive", {"period": 1.5})
    assert resp.status_code == 200 and resp.json() == {"keepalive_period": 1.5}
    assert site.daemon.keepalive.period == 1.5
    assert status(site)["keepalive_period"] == 1.5
    assert metrics(site)["jobdist_keepalive_period_seconds"] == 1.5
    assert post(site, "/keepalive", {"period": 5}).status_code == 200


@pytest.mark.parametrize(("path", "body", "message"), [
    ("/workers", b"{not json", "not JSON"),
    ("/workers", b"[1, 2]", "JSON object"),
    ("/workers", b"", "not JSON"),
    ("/workers", b'{"size": -1}', '"size" must be'),
    ("/workers", b'{"size": "4"}', '"size" must be'),
    ("/workers", b'{"size": true}', '"size" must be'),
    ("/workers", b'{"count": 4}', '"size" must be'),
    ("/keepalive", b'{"period": 0}', '"period" must be'),
    ("/keepalive", b'{"period": "fast"}', '"period" must be'),
    ("/keepalive", b'{"period": 1e9}', '"period" must be'),
])
def test_bad_requests_are_400(site: Running, path: str, body: bytes, message: str) -> None:
    before = status(site)
    resp = post(site, path, data=body)
    assert resp.status_code == 400
    assert message in resp.json()["error"]
    after = status(site)
    assert after["workers"]["size"] == before["workers"]["size"]
    assert after["keepalive_period"] == before["keepalive_period"]


def test_too_large_body_is_refused(site: Running) -> None:
    resp = post(site, "/workers", data=b" " * (128 * 1024))
    assert resp.status_code == 413


def test_unknown_paths_and_methods(site: Running) -> None:
    assert requests.get(f"{site.url}/nothing", timeout=5).status_code == 404
    resp = requests.get(f"{site.url}/workers", timeout=5)
    assert resp.status_code == 405 and resp.headers["Allow"] == "POST"
    assert post(site, "/status", {}).status_code == 405


def test_no_token_configured_refuses_every_write(site: Running) -> None:
    admin = AdminServer(site.daemon, "127.0.0.1", 0, token=None)
    admin.start()
    try:
        for token in (None, TOKEN, ""):
            headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
            resp = requests.post(f"{admin.url}/workers", json={"size": 9}, headers=headers,
                                 timeout=5)
            assert resp.status_code == 403 and "no admin token" in resp.json()["error"]
        assert requests.get(f"{admin.url}/status", timeout=5).status_code == 200
    finally:
        admin.stop()
    assert status(site)["workers"]["size"] != 9


def test_a_taken_port_is_one_clear_error(site: Running) -> None:
    assert site.daemon.admin is not None
    other = AdminServer(site.daemon, "127.0.0.1", site.daemon.admin.port, token=TOKEN)
    with pytest.raises(ConfigError, match=r"admin endpoint: cannot listen on 127\.0\.0\.1:"):
        other.start()


def test_an_unreachable_couchdb_is_a_metric_not_an_error(site: Running) -> None:
    wait_for(lambda: status(site)["counts"].get("steps_started"))
    gone = Couch(f"http://127.0.0.1:{free_port()}", timeout=1.0, retries=1).database("jobs")
    families = {family.name: family for family in SiteCollector(site.daemon, gone).collect()}
    assert families["jobdist_couch_up"].samples[0].value == 0
    assert "jobdist_feed_lag" not in families
    assert families["jobdist_steps_started"].samples[0].value >= 1


def test_helpers(tmp_path: Path) -> None:
    assert seq_number(12) == 12
    assert seq_number("34-g1AAAABXeJzLYWBgYMpgTmHgz8tPSTV0MDQy") == 34
    assert seq_number(None) is None and seq_number(True) is None and seq_number("now") is None
    fake = tmp_path / "status"
    fake.write_text("Name:\tpython\nVmRSS:\t  2048 kB\n")
    assert resident_memory_bytes(fake) == 2048 * 1024
    assert resident_memory_bytes(tmp_path / "missing") is None
