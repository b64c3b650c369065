"""docker-compose.yml, the Dockerfile and the setup they run.

Always: the compose file and Dockerfile are checked as files (every site has a
server and a daemon, named volumes, credentials only from the environment,
health checks), the CouchDB health check runs against stub servers, and
`setup_sites` runs against two real pouchdb-servers. Where a Docker engine
answers (`docker` marker), the compose project comes up and runs the thesis's
scenario 1; elsewhere that test is skipped with the reason.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from jobdist.config import CouchSettings, SiteConfig, load_sites
from jobdist.couch import Couch
from jobdist.lab.localserver import LocalServer, free_port
from jobdist.model import new_job, new_step
from jobdist.setup import setup_sites
from jobdist.topology import endpoint

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
COMPOSE_SITES = ROOT / "sites" / "compose"
SITES_IN_IMAGE = "/etc/jobdist/sites"
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
        assert "/status" in " ".join(service["healthcheck"]["test"])
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
    assert by_name["FROM"] == ["python:3.11-slim"]
    assert by_name["USER"][-1] not in ("root", "0")
    assert json.loads(by_name["ENTRYPOINT"][-1]) == ["jobdist", "site", "run"]
    assert json.loads(by_name["CMD"][-1]) == ["--config", "/etc/jobdist/site.toml"]
    assert f"sites/compose {SITES_IN_IMAGE}" in by_name["COPY"]
    ignored = (ROOT / ".dockerignore").read_text().split()
    for needed in ("jobdist", "couch_design", "sites", "pyproject.toml", "README.md"):
        assert needed not in ignored


class _Stub(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.parametrize(("body", "healthy"), [
    (b'{"status":"ok","seeds":{}}', True),
    (b'{"status":"maintenance_mode"}', False),
])
def test_the_couchdb_healthcheck_command(compose: dict[str, Any], body: bytes,
                                         healthy: bool) -> None:
    """The image has no curl; the bash /dev/tcp check must tell up from not up."""
    test = compose["services"]["couchdb-global"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "bash", "-c"]
    handler = type("Handler", (_Stub,), {"body": body})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        script = test[3].replace("/5984", f"/{server.server_address[1]}")
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


# --- the compose project on a Docker engine ------------------------------------------------

SUBMIT = """
from jobdist.config import load_site
from jobdist.client import site_database
from jobdist.model import new_job, new_step
site = load_site("/etc/jobdist/sites/global.toml")
db = site_database(site)
job = new_job("global", [new_step("sleep 1") for _ in range(3)])
db.save(job)
print(job["_id"])
"""

READ = """
import json, sys
from jobdist.config import load_site
from jobdist.client import site_database
site = load_site(f"/etc/jobdist/sites/{sys.argv[1]}.toml")
db = site_database(site)
print(json.dumps(db.get(sys.argv[2])))
"""


STATUS = """
import urllib.request
print(urllib.request.urlopen("http://127.0.0.1:7984/status", timeout=5).read().decode())
"""


def read_job(container: Any, site: str, job_id: str) -> dict[str, Any] | None:
    return json.loads(run_in(container, READ, site, job_id))


def docker_client() -> Any:
    import docker

    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as error:  # the SDK raises several kinds when no engine answers
        pytest.skip(f"no Docker engine answers ({type(error).__name__}: {error}); "
                    "the compose scenario needs one")
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0:
        pytest.fail("a Docker engine answers but `docker compose` (the Compose v2 plugin) "
                    "is missing: install docker-compose-plugin", pytrace=False)
    return client


def run_in(container: Any, script: str, *args: str) -> str:
    code, output = container.exec_run(["python", "-c", script, *args])
    assert code == 0, output.decode(errors="replace")
    return output.decode().strip().splitlines()[-1]


def wait_healthy(client: Any, project: str, names: list[str], timeout: float) -> dict[str, Any]:
    """The project's containers by service, once `names` are healthy; fails on a dead one."""
    deadline = time.monotonic() + timeout
    while True:
        containers = {c.labels["com.docker.compose.service"]: c for c in client.containers.list(
            all=True, filters={"label": f"com.docker.compose.project={project}"})}
        setup = containers.get("setup")
        if setup is not None and setup.attrs["State"]["Status"] == "exited":
            assert setup.attrs["State"]["ExitCode"] == 0, setup.logs().decode(errors="replace")
        for name in names:
            if name in containers and containers[name].attrs["State"]["Status"] == "exited":
                pytest.fail(f"{name} exited:\n{containers[name].logs().decode(errors='replace')}")
        health = {name: containers[name].attrs["State"].get("Health", {}).get("Status")
                  if name in containers else None for name in names}
        if all(status == "healthy" for status in health.values()):
            return containers
        assert time.monotonic() < deadline, f"not healthy in time: {health}"
        time.sleep(2)


@pytest.mark.docker
def test_compose_runs_scenario_1() -> None:
    client = docker_client()
    project = f"jobdist-test-{secrets.token_hex(4)}"
    env = {**os.environ, "COUCHDB_PASSWORD": secrets.token_urlsafe(16),
           "JOBDIST_ADMIN_TOKEN": secrets.token_urlsafe(16)}
    for name in ("GLOBAL", "REG_A", "REG_B"):  # never the defaults: a local cluster may hold them
        env[f"JOBDIST_PASSWORD_{name}"] = secrets.token_urlsafe(16)
        env[f"COUCH_PORT_{name}"] = str(free_port())
        env[f"ADMIN_PORT_{name}"] = str(free_port())
    compose = ["docker", "compose", "-p", project, "-f", str(COMPOSE_FILE)]
    try:
        subprocess.run([*compose, "up", "-d", "--build"], env=env, check=True, cwd=ROOT,
                       timeout=900)
        daemons = ["jobdist-global", "jobdist-reg-a", "jobdist-reg-b"]
        containers = wait_healthy(client, project, daemons, timeout=300)
        job_id = run_in(containers["jobdist-global"], SUBMIT)
        deadline = time.monotonic() + 180
        while not (doc := read_job(containers["jobdist-global"], "global", job_id))[
                "job_status"]:
            assert time.monotonic() < deadline, f"job not done: {doc}"
            time.sleep(1)
        assert doc["job_status"] == "success", doc
        assert all(step["winner"] in ("global", "reg_a", "reg_b") for step in doc["job"])
        for site in ("reg_a", "reg_b"):  # the end replicated to every site
            container = containers[f"jobdist-{site.replace('_', '-')}"]
            deadline = time.monotonic() + 60
            while (read_job(container, site, job_id) or {}).get("job_status") != "success":
                assert time.monotonic() < deadline, f"{site} did not see the job end"
                time.sleep(1)
        status = json.loads(run_in(containers["jobdist-global"], STATUS))
        assert status["site"] == "global" and status["counts"]
    except BaseException:
        subprocess.run([*compose, "logs", "--no-color", "--tail", "100"], env=env, cwd=ROOT,
                       timeout=120)
        raise
    finally:
        subprocess.run([*compose, "down", "-v", "--remove-orphans", "--timeout", "30"],
                       env=env, cwd=ROOT, timeout=300)
