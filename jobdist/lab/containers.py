"""Three sites in containers: docker-compose.yml on the private engine, for the tests.

A `ComposeSites` is one compose project: the production compose file, the
stand-in override (jobdist/lab/stand_in/compose.yml) and an override of its own that
mounts the test's site configs (short leases) and a ledger directory every
daemon's steps append to (jobdist.lab.audit), and names the image each jobdist
service runs (an earlier release's, for the rolling upgrade). Jobs are submitted
and read from the host, through each site's CouchDB port published on 127.0.0.1,
as the site's own user.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import load_site
from ..core import merge
from ..couch import Couch, Database
from ..model import Doc, as_doc, new_step
from .audit import Audit, LedgerRow, audit_run, read_ledger
from .engine import Engine
from .images import JOBDIST_IMAGE, STAND_IN_COMPOSE
from .localserver import CHECKOUT, free_port
from .scenarios import ledger_command, submit_all, wait_until_done

SITES = ("global", "reg_a", "reg_b")
COMPOSE_SITES = CHECKOUT / "sites" / "compose"
LEDGER_IN_CONTAINER = Path("/ledger/ledger.txt")
SITES_IN_IMAGE = "/etc/jobdist/sites"


def site_network(site: str) -> str:
    return f"site-{site.replace('_', '-')}"


def image_variable(name: str) -> str:
    """The override's variable for a jobdist service's image: `IMAGE_JOBDIST_REG_A`."""
    return f"IMAGE_{name.replace('-', '_').upper()}"


def service(kind: str, site: str) -> str:
    """docker-compose.yml's service name: `couchdb-reg-a`, `jobdist-global`."""
    return f"{kind}-{site.replace('_', '-')}"


JOBDIST_SERVICES = ("setup", *(service("jobdist", site) for site in SITES))


class ComposeSites:
    """One compose project of three sites, its files under `directory`."""

    def __init__(self, engine: Engine, directory: Path, lease: float = 8.0,
                 image: str = JOBDIST_IMAGE) -> None:
        self.engine = engine
        self.directory = directory
        self.project = f"jobdist-test-{secrets.token_hex(4)}"
        self.passwords = {site: secrets.token_urlsafe(16) for site in SITES}
        self.couch_ports = {site: free_port() for site in SITES}
        self.env = {**engine.env, "COUCHDB_PASSWORD": secrets.token_urlsafe(16),
                    "JOBDIST_ADMIN_TOKEN": secrets.token_urlsafe(16)}
        for site in SITES:
            self.env[f"JOBDIST_PASSWORD_{site.upper()}"] = self.passwords[site]
            self.env[f"COUCH_PORT_{site.upper()}"] = str(self.couch_ports[site])
            self.env[f"ADMIN_PORT_{site.upper()}"] = str(free_port())
        for name in JOBDIST_SERVICES:  # every jobdist container on `image` to begin with
            self.env[image_variable(name)] = image
        self.ledger = directory / "ledger" / "ledger.txt"
        self.override = self._write_files(lease)

    def _write_files(self, lease: float) -> Path:
        """Site configs with a short lease and the override that mounts them and the
        ledger; the daemons run as uid 10001, so the ledger directory is open to it."""
        sites_dir = self.directory / "sites"
        sites_dir.mkdir(parents=True)
        sites_dir.chmod(0o755)
        for site in SITES:
            text = (COMPOSE_SITES / f"{site}.toml").read_text()
            (sites_dir / f"{site}.toml").write_text(
                f"{text}\n[daemon]\nlease = {lease}\nclock_skew_margin = {lease / 4}\n")
        self.ledger.parent.mkdir()
        self.ledger.parent.chmod(0o777)
        mounts = [f"{sites_dir}:{SITES_IN_IMAGE}:ro", f"{self.ledger.parent}:/ledger"]
        services: dict[str, dict[str, Any]] = {
            name: {"volumes": mounts, "image": f"${{{image_variable(name)}}}"}
            for name in JOBDIST_SERVICES}
        for site in SITES:  # a network of the site's own: cut off, it still works inside
            networks = ["default", site_network(site)]
            services[service("jobdist", site)]["networks"] = networks
            services[service("couchdb", site)] = {"networks": networks}
        override = self.directory / "compose.test.yml"
        override.write_text(json.dumps({  # JSON is YAML
            "services": services, "networks": {site_network(site): {} for site in SITES}}))
        return override

    def cut_off(self, site: str) -> list[Any]:
        """Disconnect the site's containers from the network the sites share."""
        network = self.engine.client.networks.get(f"{self.project}_default")
        cut = [self.container(kind, site) for kind in ("jobdist", "couchdb")]
        for container in cut:
            network.disconnect(container)
        return cut

    def reconnect(self, cut: list[Any]) -> None:
        """Back on the shared network under their service names, as compose named them."""
        network = self.engine.client.networks.get(f"{self.project}_default")
        for container in cut:
            network.connect(container, aliases=[container.labels["com.docker.compose.service"]])

    def compose(self, *args: str, timeout: float = 300,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        files = [CHECKOUT / "docker-compose.yml", STAND_IN_COMPOSE, self.override]
        command = ["compose", "-p", self.project, "--project-directory", str(CHECKOUT),
                   *(arg for file in files for arg in ("-f", str(file))), *args]
        return self.engine.docker(*command, timeout=timeout, check=check, env=self.env)

    def up(self, timeout: float = 300) -> None:
        """Start the project; return once every daemon is healthy."""
        self.compose("up", "-d", "--no-build", timeout=timeout)
        self.wait_healthy([service("jobdist", site) for site in SITES], timeout)

    def upgrade(self, site: str, image: str, timeout: float = 120) -> str:
        """docs/operations.md's procedure at one site: stop its daemon (SIGTERM within
        stop_grace_period), run `image`'s `jobdist setup --site SITE`, start the daemon
        on `image`; once it is healthy, setup's output."""
        daemon = service("jobdist", site)
        self.compose("stop", daemon)
        self.env[image_variable("setup")] = self.env[image_variable(daemon)] = image
        setup = self.compose("run", "--rm", "--no-deps", "-T", "--entrypoint", "jobdist", "setup",
                             "setup", "--sites", SITES_IN_IMAGE, "--site", site,
                             timeout=timeout)
        self.compose("up", "-d", "--no-deps", "--no-build", daemon, timeout=timeout)
        self.wait_healthy([daemon], timeout)
        return setup.stdout

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "--timeout", "30", check=False)

    def logs(self, tail: int = 100) -> str:
        result = self.compose("logs", "--no-color", "--tail", str(tail), check=False)
        return result.stdout + result.stderr

    def containers(self) -> dict[str, Any]:
        """The project's containers by service name."""
        listed = self.engine.client.containers.list(
            all=True, filters={"label": f"com.docker.compose.project={self.project}"})
        return {c.labels["com.docker.compose.service"]: c for c in listed}

    def container(self, kind: str, site: str) -> Any:
        return self.containers()[service(kind, site)]

    def wait_healthy(self, names: list[str], timeout: float) -> None:
        """Until `names` are healthy; AssertionError on a timeout, a failed setup or a
        container that exited."""
        deadline = time.monotonic() + timeout
        while True:
            containers = self.containers()
            setup = containers.get("setup")
            if setup is not None and setup.attrs["State"]["Status"] == "exited":
                assert setup.attrs["State"]["ExitCode"] == 0, setup.logs().decode(
                    errors="replace")
            health = {}
            for name in names:
                state = containers[name].attrs["State"] if name in containers else {}
                assert state.get("Status") != "exited", f"{name} exited:\n{self.logs()}"
                health[name] = state.get("Health", {}).get("Status")
            if all(status == "healthy" for status in health.values()):
                return
            assert time.monotonic() < deadline, f"not healthy in time: {health}"
            time.sleep(1)

    def database(self, site: str) -> Database:
        """The site's jobs database from the host, as the site's own user."""
        config = load_site(COMPOSE_SITES / f"{site}.toml")
        couch = Couch(f"http://127.0.0.1:{self.couch_ports[site]}", user=f"jobdist_{site}",
                      password=self.passwords[site])
        return couch.database(config.couch.database)

    def submit(self, count: int, steps: int, step_seconds: float) -> list[str]:
        """`count` jobs at global, each of `steps` ledger steps any site may run."""
        command = ledger_command(step_seconds, LEDGER_IN_CONTAINER)
        return submit_all(self.database("global"), "global",
                          [new_step(command) for _ in range(steps)], count)

    def submit_at_every_site(self, count: int, step_seconds: float) -> list[str]:
        """At each site, `count` jobs of three ledger steps: one for any site, one for
        every site, one for reg_b."""
        command = ledger_command(step_seconds, LEDGER_IN_CONTAINER)
        steps = [new_step(command), new_step(command, target="all"),
                 new_step(command, target="reg_b")]
        return [job for site in SITES
                for job in submit_all(self.database(site), site, steps, count)]

    def wait_done(self, ids: list[str], timeout: float) -> dict[str, Doc]:
        """The jobs once every site shows them ended, each merged from the leaves of
        every site: a site cut off may still be sending its branch (its stale runs'
        events) when the creator's copy already shows the end."""
        for site in SITES:
            wait_until_done(self.database(site), ids, timeout)
        found: dict[str, dict[str, Doc]] = {doc_id: {} for doc_id in ids}
        for site in SITES:
            for doc_id, leaves in self.database(site).leaves_many(ids).items():
                found[doc_id].update((leaf["_rev"], leaf) for leaf in leaves
                                     if not leaf.get("_deleted"))
        return {doc_id: as_doc(merge(list(leaves.values()))) for doc_id, leaves in found.items()}

    def audit(self, ids: list[str], docs: dict[str, Doc]) -> Audit:
        return audit_run(read_ledger(self.ledger), docs, ids)

    def wait_for_ledger(self, found: Callable[[list[LedgerRow]], Any],
                        timeout: float = 60) -> Any:
        """Until `found(ledger rows)` is truthy; its value."""
        deadline = time.monotonic() + timeout
        while not (value := found(read_ledger(self.ledger))):
            assert time.monotonic() < deadline, "the ledger never showed what was awaited"
            time.sleep(0.2)
        return value


def running_on(site: str) -> Callable[[list[LedgerRow]], bool]:
    """A ledger test: a step started on `site` and has not ended."""
    def test(rows: list[LedgerRow]) -> bool:
        starts = {row[1:] for row in rows if row[0] == "start" and row[3] == site}
        ends = {row[1:] for row in rows if row[0] == "end"}
        return bool(starts - ends)
    return test
