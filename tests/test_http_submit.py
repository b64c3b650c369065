"""End to end: the README's curl submission, on real local sites.

The job is written straight into a site's CouchDB with only the fields a user
writes (`type`, `creator`, the steps); the sites must accept it and run it to
the end, filling in every default on the way.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from jobdist.client import read_merged_many
from jobdist.clock import later, utc_now
from jobdist.config import SiteConfig
from jobdist.lab.cluster import LocalCluster
from jobdist.lab.scenarios import site_db, wait_until_done, write_sites
from jobdist.model import JOB_DEFAULTS, STEP_DEFAULTS, Doc
from jobdist.validation import validate_job

from .helpers import readme_http_submission

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("http")
    with LocalCluster(write_sites(root / "sites", 2), root / "state", in_memory=True) as local:
        yield local


def post_with_curl(block: str, site: SiteConfig, sites_dir: Path) -> Doc:
    """Run the README's own commands, pointed at this cluster's site and secrets."""
    script = (block.replace("http://127.0.0.1:5984", site.couch.url)
              .replace(".jobdist/secrets/", f"{sites_dir}/secrets/"))
    run = subprocess.run(["bash", "-euc", script], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def post_with_requests(doc: Doc, site: SiteConfig) -> Doc:
    response = requests.post(f"{site.couch.url}/{site.couch.database}", json=doc,
                             auth=(site.couch.user or "", site.couch.password or ""), timeout=10)
    return response.json()


def test_the_readme_curl_submission_runs_to_success(cluster: LocalCluster) -> None:
    block, doc = readme_http_submission()
    site = cluster.sites["global"]
    if shutil.which("curl"):
        answer = post_with_curl(block, site, cluster.sites_dir)
    else:
        answer = post_with_requests(doc, site)
    assert answer.get("ok") is True, answer
    db = site_db(cluster, "global")
    [ended] = wait_until_done(db, [answer["id"]], timeout=60)
    assert ended["job_status"] == "success"

    final = read_merged_many(db, [answer["id"]])[answer["id"]]
    assert validate_job(final) == []
    assert set(final) >= set(JOB_DEFAULTS) and set(final["job"][0]) >= set(STEP_DEFAULTS)
    assert final["created_at"] is not None  # stamped by the creator's first revision
    events = [entry["event"] for entry in final["history"]]
    assert events[0] == "created" and events[-1] == "finished"
    assert final["job"][0]["step_status"] == "finished" and final["job"][0]["exit_code"] == 0


def test_a_job_written_over_http_may_wait_for_another_and_for_a_time(
        cluster: LocalCluster) -> None:
    """The fields a user writes, `after` and `not_before` among them: the creator accepts
    the job (stamps its creation time) and releases it in its own time."""
    site = cluster.sites["global"]
    first = post_with_requests({"type": "job", "creator": "reg_a",
                                "job": [{"target": "reg_a", "do": "sleep 0.5"}]},
                               cluster.sites["reg_a"])
    not_before = later(utc_now(), 2.0)
    second = post_with_requests({"type": "job", "creator": "global", "after": [first["id"]],
                                 "not_before": not_before,
                                 "job": [{"target": "any", "do": "true"}]}, site)
    assert second.get("ok") is True, second
    db = site_db(cluster, "global")
    _, ended = wait_until_done(db, [first["id"], second["id"]], timeout=60)
    assert ended["job_status"] == "success"
    final = read_merged_many(db, [second["id"]])[second["id"]]
    assert validate_job(final) == []
    events = [entry["event"] for entry in final["history"]]
    assert events[:1] == ["created"] and "ready" in events
    ready = next(entry for entry in final["history"] if entry["event"] == "ready")
    assert ready["at"] >= not_before and ready["site"] == "global"
