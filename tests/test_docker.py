"""docker-compose.yml, the Dockerfile and the setup they run.

Always: the compose file and Dockerfile are checked as files (every site has a
server and a daemon, named volumes, credentials only from the environment,
health checks), the CouchDB health check runs against stub servers, and
`setup_sites` runs against two real pouchdb-servers. Where this machine can run
a Docker engine of its own (`docker` marker), three sites come up in containers
for each test of docs/operations.md's table (scenario 1, faults, a rolling
upgrade); elsewhere those tests are skipped with the reason.
"""

from __future__ import annotations

import http.server
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from jobdist.config import CouchSettings, SiteConfig, load_sites
from jobdist.couch import Couch
from jobdist.design import DDOC, DESIGN_VERSION, PEOPLE_DDOC, VERSION_FIELD
from jobdist.lab.audit import Audit, read_ledger
from jobdist.lab.containers import (
    LEDGER_IN_CONTAINER,
    SITES,
    SITES_IN_IMAGE,
    ComposeSites,
    running_on,
    service,
)
from jobdist.lab.engine import Engine, private_engine, unavailable_reason
from jobdist.lab.images import (
    JOBDIST_IMAGE,
    ReleaseMissing,
    build_all,
    ensure_release,
    image_size_mb,
)
from jobdist.lab.localserver import LocalServer, free_port
from jobdist.lab.scenarios import THESIS_SCENARIOS, submit_all, wait_until_done
from jobdist.model import new_job, new_step
from jobdist.setup import setup_sites
from jobdist.topology import endpoint
from tests.test_upgrade import PREVIOUS_RELEASE

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
COMPOSE_SITES = ROOT / "sites" / "compose"
ENV_REF = re.compile(r"^\$\{[A-Z][A-Z0-9_]*(:[-?][^}]*)?\}$")
REQUIRED_ENV_REF = re.compile(r"^\$\{[A-Z][A-Z0-9_]*:\?[^}]+\}$")
DEFAULT_ADMIN_PORTS = {"global": 7984, "reg_a": 7985, "reg_b": 7986}


# --- the files ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def sites() -> dict[str, SiteConfig]:
    return load_sites(COMPOSE_SITES)


def server_service(site: SiteConfig) -> str:
    host = urlsplit(site.couch.url).hostname
    assert host is not None
    return host


def daemon_services(compose: dict[str, Any], site: SiteConfig) -> list[str]:
    config = f"{SITES_IN_IMAGE}/{site.name}.toml"
    return [name for name, service in compose["services"].items()
            if config in service.get("command", [])]


def test_compose_has_three_sites_each_with_a_server_and_a_daemon(
        compose: dict[str, Any], sites: dict[str, SiteConfig]) -> None:
    assert set(sites) == {"global", "reg_a", "reg_b"}
    servers = {server_service(site) for site in sites.values()}
    daemons = {name for site in sites.values() for name in daemon_services(compose, site)}
    assert len(servers) == len(daemons) == 3
    assert set(compose["services"]) == servers | daemons | {"setup"}
    for site in sites.values():
        assert len(daemon_services(compose, site)) == 1, site.name
        assert set(site.peers) == set(sites) - {site.name}  # a full mesh


def test_servers_are_couchdb_3_with_named_volumes_and_env_credentials(
        compose: dict[str, Any], sites: dict[str, SiteConfig]) -> None:
    volumes = set(compose["volumes"])
    for site in sites.values():
        service = compose["services"][server_service(site)]
        assert service["image"] == "couchdb:3"
        assert urlsplit(site.couch.url).port == 5984
        env = service["environment"]
        assert ENV_REF.match(env["COUCHDB_USER"])
        assert REQUIRED_ENV_REF.match(env["COUCHDB_PASSWORD"])  # no default, no secret
        mounts = dict(volume.split(":", 1) for volume in service["volumes"])
        data = [name for name, target in mounts.items() if target == "/opt/couchdb/data"]
        assert data and data[0] in volumes, f"{site.name}: data not on a named volume"
        assert service["healthcheck"]["test"]
        assert all(port.startswith("127.0.0.1:") for port in service["ports"])
    assert len(volumes) == 3


def test_daemons_run_the_site_with_env_credentials_after_setup(
        compose: dict[str, Any], sites: dict[str, SiteConfig]) -> None:
    for site in sites.values():
        name = daemon_services(compose, site)[0]
        service = compose["services"][name]
        assert service["build"] == "."
        env = service["environment"]
        # Each daemon logs in as its own site's user, never as the CouchDB admin.
        assert env["JOBDIST_COUCH_USER"] == f"jobdist_{site.name}"
        assert env["JOBDIST_COUCH_PASSWORD"] == (
            f"${{JOBDIST_PASSWORD_{site.name.upper()}:?set JOBDIST_PASSWORD_{site.name.upper()}}}")
        assert REQUIRED_ENV_REF.match(env["JOBDIST_ADMIN_TOKEN"])
        assert not any("ADMIN_USER" in key or "ADMIN_PASSWORD" in key for key in env)
        assert service["depends_on"]["setup"]["condition"] == "service_completed_successfully"
        assert "healthcheck" not in service  # the image's own: the admin endpoint answers
        assert service["init"] is True  # reaps the steps' orphans
        host_port = f"${{ADMIN_PORT_{site.name.upper()}:-{DEFAULT_ADMIN_PORTS[site.name]}}}"
        assert service["ports"] == [f"127.0.0.1:{host_port}:{site.admin.port}"]
        # The daemon's config holds no secret: they come from the environment above.
        assert site.admin.port == 7984 and site.admin.host == "0.0.0.0"
        raw = (COMPOSE_SITES / f"{site.name}.toml").read_text()
        assert not re.search(r"^\s*(password|token|user)\s*=", raw, re.MULTILINE)


def test_setup_waits_for_every_server_and_runs_once(
        compose: dict[str, Any], sites: dict[str, SiteConfig]) -> None:
    setup = compose["services"]["setup"]
    assert setup["entrypoint"] == ["python", "-m", "jobdist.setup"]
    assert setup["command"] == ["--sites", SITES_IN_IMAGE]
    assert setup["restart"] == "no"
    assert setup["depends_on"] == {server_service(site): {"condition": "service_healthy"}
                                   for site in sites.values()}
    env = setup["environment"]
    assert REQUIRED_ENV_REF.match(env["JOBDIST_COUCH_ADMIN_PASSWORD"])
    for site in sites.values():  # setup creates every site's user on every server
        assert env[f"JOBDIST_COUCH_USER_{site.name.upper()}"] == f"jobdist_{site.name}"
        assert REQUIRED_ENV_REF.match(env[f"JOBDIST_COUCH_PASSWORD_{site.name.upper()}"])


def test_no_secret_is_written_in_the_compose_file() -> None:
    for line in COMPOSE_FILE.read_text().splitlines():
        match = re.match(r"\s*([A-Z_]*(PASSWORD|TOKEN|SECRET)[A-Z_]*):\s*(\S.*)$", line)
        if match:
            assert REQUIRED_ENV_REF.match(match.group(3)), line


def test_dockerfile_builds_a_non_root_daemon() -> None:
    text = (ROOT / "Dockerfile").read_text()
    instructions = [line.split(None, 1) for line in text.splitlines()
                    if line.strip() and not line.lstrip().startswith("#")
                    and not line.startswith(" ")]
    by_name: dict[str, list[str]] = {}
    for parts in instructions:
        by_name.setdefault(parts[0], []).append(parts[1] if len(parts) > 1 else "")
    assert by_name["ARG"] == ["PYTHON_IMAGE=python:3.11-slim"]  # the tests' base: their own
    assert by_name["FROM"] == ["${PYTHON_IMAGE}"]
    assert by_name["USER"][-1] not in ("root", "0")
    assert by_name["HEALTHCHECK"][0].startswith("--interval=5s")
    assert "urlopen('http://127.0.0.1:7984/status'" in text
    assert json.loads(by_name["ENTRYPOINT"][-1]) == ["jobdist", "site", "run"]
    assert json.loads(by_name["CMD"][-1]) == ["--config", "/etc/jobdist/site.toml"]
    assert f"sites/compose {SITES_IN_IMAGE}" in by_name["COPY"]
    ignored = (ROOT / ".dockerignore").read_text().split()
    for needed in ("jobdist", "couch_design", "sites", "pyproject.toml", "README.md"):
        assert needed not in ignored


class _Stub(http.server.BaseHTTPRequestHandler):
    answers: dict[str, tuple[int, bytes]] = {}  # path: (status, body)

    def do_GET(self) -> None:
        status, body = self.answers.get(self.path, (404, b'{"error":"not_found"}'))
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


WELCOME = (200, b'{"express-pouchdb":"Welcome!","version":"4.2.0"}')


@pytest.mark.parametrize(("answers", "healthy"), [
    ({"/_up": (200, b'{"status":"ok","seeds":{}}')}, True),  # CouchDB 3
    ({"/_up": (200, b'{"status":"maintenance_mode"}'), "/": WELCOME}, False),
    ({"/": WELCOME}, True),  # pouchdb-server: no /_up
    ({"/": (200, b'{"other":"server"}')}, False),
    ({"/_up": (500, b'{"error":"unknown"}'), "/": WELCOME}, False),
])
def test_the_couchdb_healthcheck_command(compose: dict[str, Any],
                                         answers: dict[str, tuple[int, bytes]],
                                         healthy: bool) -> None:
    """The image has no curl; the bash /dev/tcp check must tell up from not up, on
    CouchDB 3 (/_up) and on the tests' pouchdb-server stand-in (no /_up, a welcome)."""
    test = compose["services"]["couchdb-global"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "bash", "-c"]
    handler = type("Handler", (_Stub,), {"answers": answers})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        # Compose reads `$$` as a `$`.
        script = test[3].replace("$$", "$").replace("/5984", f"/{server.server_address[1]}")
        result = subprocess.run(["bash", "-c", script], timeout=10, capture_output=True)
        assert (result.returncode == 0) is healthy
    finally:
        server.shutdown()
        server.server_close()


# --- setup_sites on real servers ---------------------------------------------------------


def write_pair(directory: Path, urls: dict[str, str]) -> Path:
    directory.mkdir()
    for name, url in urls.items():
        peers = [f'"{peer}"' for peer in urls if peer != name]
        (directory / f"{name}.toml").write_text(
            f'name = "{name}"\npeers = [{", ".join(peers)}]\n\n'
            f'[couch]\nurl = "{url}"\ndatabase = "jobs"\n')
    return directory


@pytest.fixture
def two_servers(tmp_path: Path) -> Iterator[dict[str, LocalServer]]:
    servers: dict[str, LocalServer] = {}
    try:
        for name in ("north", "south"):
            servers[name] = LocalServer(free_port(), tmp_path / name, in_memory=True)
            servers[name].start()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def test_setup_sites_creates_everything_once(two_servers: dict[str, LocalServer],
                                             tmp_path: Path) -> None:
    sites = load_sites(write_pair(tmp_path / "sites", {n: s.url for n, s in two_servers.items()}))
    written: list[str] = []
    assert setup_sites(sites, report=written.append) == 8
    assert sorted(written) == sorted([
        "north: created database jobs", "south: created database jobs",
        "north: wrote _design/jobdist", "south: wrote _design/jobdist",
        "north: wrote _design/jobdist_people", "south: wrote _design/jobdist_people",
        "north: wrote replication jobdist-north-to-south (jobdist/jobs)",
        "south: wrote replication jobdist-south-to-north (jobdist/jobs)",
    ])
    for name, server in two_servers.items():
        couch = Couch(server.url)
        assert couch.database("jobs").get("_design/jobdist") is not None
        peer = next(other for other in two_servers if other != name)
        replication = couch.database("_replicator").get(f"jobdist-{name}-to-{peer}")
        assert replication is not None
        assert replication["source"] == "jobs"  # pouchdb-server: by name, read in process
        assert replication["target"] == f"{two_servers[peer].url}/jobs"
        assert replication["filter"] == "jobdist/jobs" and replication["continuous"] is True
    # An operator's own design document is theirs: setup neither rewrites nor removes it.
    own = {"_id": "_design/ops", "views": {"all": {"map": "function (doc) { emit(doc._id); }"}}}
    Couch(two_servers["north"].url).database("jobs").save(own)
    assert setup_sites(sites) == 0  # idempotent
    assert Couch(two_servers["north"].url).database("jobs").get("_design/ops")["views"] == \
        own["views"]

    job = new_job("north", [new_step("true")])
    Couch(two_servers["north"].url).database("jobs").save(job)
    south = Couch(two_servers["south"].url).database("jobs")
    deadline = time.monotonic() + 30
    while south.get(job["_id"]) is None:
        assert time.monotonic() < deadline, "the job did not replicate north -> south"
        time.sleep(0.1)


def test_setup_command_errors_are_one_line(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "jobdist.setup", "--sites",
                             str(tmp_path / "missing")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"jobdist setup: {tmp_path / 'missing'}: no such sites directory"]


def test_setup_command_reports_an_unreachable_server(tmp_path: Path) -> None:
    sites_dir = write_pair(tmp_path / "sites", {"lone": f"http://127.0.0.1:{free_port()}"})
    result = subprocess.run([sys.executable, "-m", "jobdist.setup", "--sites", str(sites_dir),
                             "--timeout", "1"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_replication_endpoints_carry_the_pushing_sites_credentials() -> None:
    site = SiteConfig("global", CouchSettings("http://couchdb-global:5984", "jobs"))
    assert endpoint(site.couch.url, "jobs", site) == "http://couchdb-global:5984/jobs"
    with_password = SiteConfig("global", CouchSettings(
        "http://couchdb-global:5984", "jobs", user="jobdist_global", password="p@ss:w/rd"))
    assert endpoint("http://couchdb-reg-a:5984", "jobs", with_password) == (
        "http://jobdist_global:p%40ss%3Aw%2Frd@couchdb-reg-a:5984/jobs")
    renamed = SiteConfig("global", CouchSettings("https://old:one@h", "db", user="new"))
    assert endpoint(renamed.couch.url, "db", renamed) == "https://new@h/db"


# --- three sites in containers, on a private engine ---------------------------------------

STEP_SECONDS = 2.0
LEASE = 8.0  # the sites' lease in these tests (ComposeSites); the creator waits past it
UPGRADE_STEP_SECONDS = 1.0  # reg_b runs two steps of each job in the upgrade test


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    """A dockerd of our own (jobdist.lab.engine) with every image built; skipped with the
    reason where the machine cannot run one."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"no Docker engine on this machine: {reason}")
    started = time.monotonic()
    with private_engine() as running:
        seconds = build_all(running)
        print(f"engine and images ready in {time.monotonic() - started:.0f} s {seconds}; "
              f"jobdist image {image_size_mb(running, JOBDIST_IMAGE)} MB")
        yield running


@contextmanager
def sites_up(engine: Engine, directory: Path, image: str = JOBDIST_IMAGE
             ) -> Iterator[ComposeSites]:
    """Three sites on `image`, up and healthy; their logs printed (shown on a failure),
    then down."""
    project = ComposeSites(engine, directory, lease=LEASE, image=image)
    try:
        project.up()
        yield project
    finally:
        print(project.logs())
        project.down()


@pytest.fixture
def three_sites(engine: Engine, tmp_path: Path) -> Iterator[ComposeSites]:
    with sites_up(engine, tmp_path) as project:
        yield project


def assert_audit_holds(sites: ComposeSites, ids: list[str], timeout: float = 240) -> Audit:
    """Every job ends in success, and the ledger audit holds: nothing lost, each step ran
    once or its extra runs are explained by the job's history."""
    docs = sites.wait_done(ids, timeout)
    audit = sites.audit(ids, docs)
    assert audit.ok, "\n".join(audit.problems)
    print(f"{len(ids)} jobs, {audit.runs} runs, duplicates: {audit.duplicates}")
    return audit


@pytest.mark.docker
def test_compose_runs_scenario_1(three_sites: ComposeSites) -> None:
    sites = three_sites
    scenario = THESIS_SCENARIOS[0]
    steps = scenario.job_steps(STEP_SECONDS, LEDGER_IN_CONTAINER)
    ids = submit_all(sites.database("global"), "global", steps, scenario.jobs)
    assert_audit_holds(sites, ids)
    for site in ("reg_a", "reg_b"):  # the end replicated to every site
        wait_until_done(sites.database(site), ids, timeout=60)
    listed = [json.loads(line) for line in
              sites.compose("ps", "--all", "--format", "json").stdout.splitlines()]
    states = {entry["Service"]: (entry["State"], entry["Health"]) for entry in listed}
    assert states.pop("setup")[0] == "exited"
    assert states == {name: ("running", "healthy") for name in states} and len(states) == 6


@pytest.mark.docker
def test_a_daemon_container_killed_mid_step_and_restarted(three_sites: ComposeSites) -> None:
    sites = three_sites
    ids = sites.submit(count=6, steps=3, step_seconds=STEP_SECONDS)
    sites.wait_for_ledger(running_on("reg_a"))
    daemon = sites.container("jobdist", "reg_a")
    daemon.kill()  # SIGKILL: the step it ran dies with it, unrecorded
    daemon.wait(timeout=30)
    daemon.start()
    sites.wait_healthy([service("jobdist", "reg_a")], timeout=120)
    assert_audit_holds(sites, ids)


@pytest.mark.docker
def test_a_site_cut_off_past_the_lease_then_reconnected(three_sites: ComposeSites) -> None:
    sites = three_sites
    ids = sites.submit(count=6, steps=3, step_seconds=STEP_SECONDS)
    sites.wait_for_ledger(running_on("reg_b"))
    cut = sites.cut_off("reg_b")
    time.sleep(LEASE * 2.5)  # past the lease and the creator's margin: it revokes
    sites.reconnect(cut)
    assert_audit_holds(sites, ids)
    revoked = [entry for doc in sites.wait_done(ids, 10).values() for entry in doc["history"]
               if entry["event"] == "released" and entry["site"] != "reg_b"
               and "reg_b" in (entry.get("detail") or "")]
    assert revoked, "the creator never revoked the cut-off site's lease"


@pytest.mark.docker
def test_compose_restart_of_one_site_while_jobs_run(three_sites: ComposeSites) -> None:
    sites = three_sites
    ids = sites.submit(count=6, steps=3, step_seconds=STEP_SECONDS)
    sites.wait_for_ledger(running_on("reg_a"))
    sites.compose("restart", service("couchdb", "reg_a"), service("jobdist", "reg_a"))
    sites.wait_healthy([service("jobdist", "reg_a")], timeout=120)
    assert_audit_holds(sites, ids)


@pytest.mark.docker
def test_docker_stop_of_a_daemon_is_graceful(three_sites: ComposeSites) -> None:
    sites = three_sites
    grace = yaml.safe_load(COMPOSE_FILE.read_text())["x-jobdist"]["stop_grace_period"]
    ids = sites.submit(count=6, steps=3, step_seconds=STEP_SECONDS)
    sites.wait_for_ledger(running_on("reg_b"))
    daemon = sites.container("jobdist", "reg_b")
    started = time.monotonic()
    sites.compose("stop", service("jobdist", "reg_b"))
    stopped_in = time.monotonic() - started
    daemon.reload()
    assert daemon.attrs["State"]["ExitCode"] == 0, daemon.logs().decode(errors="replace")
    assert stopped_in < float(grace.removesuffix("s")), stopped_in
    # Its running steps ended or were released: nothing it held is left to wait out.
    assert not running_on("reg_b")(read_ledger(sites.ledger))
    assert_audit_holds(sites, ids)
    print(f"stopped in {stopped_in:.1f} s")


@pytest.fixture(scope="module")
def previous_image(engine: Engine) -> str:
    """The previous release's image (tests/test_upgrade.py's PREVIOUS_RELEASE), built
    once; skipped with the reason where this clone's history lacks the commit."""
    started = time.monotonic()
    try:
        image = ensure_release(engine, PREVIOUS_RELEASE)
    except ReleaseMissing as error:
        pytest.skip(str(error))
    print(f"{image} ready in {time.monotonic() - started:.0f} s, "
          f"{image_size_mb(engine, image)} MB")
    return image


def design_versions(sites: ComposeSites) -> list[int | None]:
    """Each site's design documents' version (None: from a release before versions)."""
    versions = []
    for site in SITES:
        database = sites.database(site)
        found = {database.get(f"_design/{name}").get(VERSION_FIELD)
                 for name in (DDOC, PEOPLE_DDOC)}
        assert len(found) == 1, f"{site}: its design documents disagree: {found}"
        versions.append(found.pop())
    return versions


def daemon_images(sites: ComposeSites) -> list[str]:
    return [sites.container("jobdist", site).attrs["Config"]["Image"] for site in SITES]


@pytest.mark.docker
def test_sites_upgraded_one_at_a_time_in_containers(engine: Engine, previous_image: str,
                                                    tmp_path: Path) -> None:
    """docs/operations.md, "Upgrading": every site on the previous release, set up by it;
    reg_b upgraded while its steps run, then the others, jobs flowing throughout."""
    with sites_up(engine, tmp_path, image=previous_image) as sites:
        assert daemon_images(sites) == [previous_image] * 3
        assert design_versions(sites) == [None] * 3
        ids = sites.submit_at_every_site(count=2, step_seconds=UPGRADE_STEP_SECONDS)
        sites.wait_for_ledger(running_on("reg_b"))
        report = sites.upgrade("reg_b", JOBDIST_IMAGE)
        assert f"reg_b: wrote _design/{DDOC}" in report, report
        ids += sites.submit_at_every_site(count=2, step_seconds=UPGRADE_STEP_SECONDS)
        sites.wait_done(ids, timeout=240)
        assert daemon_images(sites) == [previous_image, previous_image, JOBDIST_IMAGE]
        assert design_versions(sites) == [None, None, DESIGN_VERSION]

        for site in ("global", "reg_a"):
            ids += sites.submit_at_every_site(count=2, step_seconds=UPGRADE_STEP_SECONDS)
            sites.upgrade(site, JOBDIST_IMAGE)
        ids += sites.submit_at_every_site(count=2, step_seconds=UPGRADE_STEP_SECONDS)
        assert_audit_holds(sites, ids)
        assert daemon_images(sites) == [JOBDIST_IMAGE] * 3
        assert design_versions(sites) == [DESIGN_VERSION] * 3
        assert {row[3] for row in read_ledger(sites.ledger)} == set(SITES)
