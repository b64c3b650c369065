"""The images the container tests run, built on the private engine (jobdist.lab.engine).

No image registry answers here, so the bases come from Debian's packages:
`mmdebstrap --variant=minbase` piped into `docker import`, one with Python for
jobdist, one with Node.js for the CouchDB stand-in (the checkout's pinned,
patched pouchdb-server, jobdist/lab/stand_in/). Builds use the host's network (the
engine's networks have no way out) and the host's CA bundle, copied into the
bases at a path of their own (`ca-certificates` regenerates the standard one).
The bases and the stand-in stay in the engine's data root between runs; the
jobdist image is rebuilt each run, from cached layers when its inputs are the same.
"""

from __future__ import annotations

import hashlib
import io
import logging
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

from .engine import Engine, EngineError
from .localserver import CHECKOUT, find_pouchdb_server, missing_fixes

PYTHON_BASE = "jobdist-lab/python-base:bookworm"
NODE_BASE = "jobdist-lab/node-base:bookworm"
STAND_IN = "jobdist-lab/pouchdb-server:4.2.0"
JOBDIST_IMAGE = "jobdist:local"  # docker-compose.yml's name for it
STAND_IN_DIR = Path(__file__).resolve().parent / "stand_in"
STAND_IN_COMPOSE = STAND_IN_DIR / "compose.yml"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
CA_IN_IMAGE = "/usr/local/share/jobdist-lab/host-ca.pem"
CA_VARIABLES = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")
BASE_PACKAGES = {PYTHON_BASE: ("python3", "python3-pip", "python-is-python3"),
                 NODE_BASE: ("nodejs",)}
# Documentation, manual pages and translations: not installed, a smaller image.
DPKG_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*",
                 "/usr/share/locale/*")
LOCK_LABEL = "jobdist.installed-lock"
log = logging.getLogger("jobdist.lab.images")


def build_all(engine: Engine) -> dict[str, float]:
    """Every image the compose project needs; the seconds each took (0 when cached)."""
    seconds = {}
    for name, action in ((PYTHON_BASE, lambda: ensure_base(engine, PYTHON_BASE)),
                         (NODE_BASE, lambda: ensure_base(engine, NODE_BASE)),
                         (STAND_IN, lambda: ensure_stand_in(engine)),
                         (JOBDIST_IMAGE, lambda: build_jobdist(engine))):
        started = time.monotonic()
        action()
        seconds[name] = round(time.monotonic() - started, 1)
    return seconds


def has_image(engine: Engine, name: str) -> Any:
    """The image called `name`, or None."""
    images = engine.client.images.list(name=name)
    return images[0] if images else None


def ensure_base(engine: Engine, name: str) -> None:
    """A Debian bookworm minbase with `name`'s packages, imported once."""
    if has_image(engine, name):
        return
    log.info("building %s with mmdebstrap", name)
    hooks = [f'mkdir -p "$1"{Path(CA_IN_IMAGE).parent}',
             f'cp {HOST_CA} "$1"{CA_IN_IMAGE}',
             # pip installs jobdist into the image's own Python: nothing else shares it.
             'rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED']
    debootstrap = ["mmdebstrap", "--variant=minbase", "--quiet",
                   f"--include={','.join(BASE_PACKAGES[name])}",
                   *(f"--dpkgopt=path-exclude={pattern}" for pattern in DPKG_EXCLUDES),
                   *(f"--customize-hook={hook}" for hook in hooks), "bookworm", "-"]
    changes = ["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "ENV LANG=C.UTF-8",
               *(f"ENV {variable}={CA_IN_IMAGE}" for variable in CA_VARIABLES)]
    importer = ["docker", "import", *(arg for change in changes for arg in ("--change", change)),
                "-", name]
    with subprocess.Popen(debootstrap, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as producer:
        imported = subprocess.run(importer, stdin=producer.stdout, env=engine.env,
                                  capture_output=True, text=True, timeout=900)
        assert producer.stderr is not None
        errors = producer.stderr.read().decode(errors="replace")
    if producer.returncode != 0 or imported.returncode != 0:
        raise EngineError(f"{name}: mmdebstrap exited {producer.returncode}, docker import "
                          f"{imported.returncode}:\n{errors[-2000:]}{imported.stderr[-2000:]}")


def ensure_stand_in(engine: Engine) -> None:
    """The pouchdb-server image, from the checkout's node_modules once it passes the fix
    check; rebuilt when node_modules was installed from another lock file or patches."""
    binary = find_pouchdb_server()
    missing = missing_fixes(binary)
    if missing:
        raise EngineError(f"the pouchdb-server at {binary} lacks jobdist's fixes "
                          f"({'; '.join(missing)}): run `npm ci` in the checkout")
    modules = binary.resolve().parents[2]  # node_modules/pouchdb-server/bin/pouchdb-server
    lock = hashlib.sha256((modules / ".installed-lock").read_bytes()).hexdigest()
    image = has_image(engine, STAND_IN)
    if image is not None and image.labels.get(LOCK_LABEL) == lock:
        return
    log.info("building %s from %s", STAND_IN, modules)
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        tar.add(STAND_IN_DIR / "Dockerfile", arcname="Dockerfile")
        tar.add(STAND_IN_DIR / "entrypoint.sh", arcname="entrypoint.sh")
        tar.add(modules, arcname="node_modules")
    context.seek(0)
    engine.client.images.build(fileobj=context, custom_context=True, tag=STAND_IN, rm=True,
                               buildargs={"NODE_IMAGE": NODE_BASE}, labels={LOCK_LABEL: lock})


def build_jobdist(engine: Engine) -> None:
    """The repository's Dockerfile on the Python base, tagged as docker-compose.yml names
    it: `docker compose up` then finds it and builds nothing."""
    engine.client.images.build(path=str(CHECKOUT), tag=JOBDIST_IMAGE, rm=True,
                               network_mode="host", buildargs={"PYTHON_IMAGE": PYTHON_BASE})


def image_size_mb(engine: Engine, name: str) -> float:
    return round(engine.client.images.get(name).attrs["Size"] / 1e6, 1)
