"""The images the container tests run, built on the private engine (jobdist.lab.engine).

No image registry answers here, so the bases come from Debian's packages:
`mmdebstrap --variant=minbase` piped into `docker import`, one with Python for
jobdist, one with Node.js for the CouchDB stand-in (the checkout's pinned,
patched pouchdb-server, jobdist/lab/stand_in/). Builds use the host's network (the
engine's networks have no way out) and the host's CA bundle, copied into the
bases at a path of their own (`ca-certificates` regenerates the standard one).
The bases and the stand-in stay in the engine's data root between runs; the
jobdist image is rebuilt each run, from cached layers when its inputs are the same.
An earlier release's image (`jobdist:COMMIT`, for the rolling-upgrade test) is
built from `git archive COMMIT` on the same base, once.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
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
DOCKERFILE_LABEL = "jobdist.dockerfile"
RELEASE_DOCKERFILE = "Dockerfile.lab"  # beside the release's own, in its build context
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


class ReleaseMissing(EngineError):
    """The commit is not in this clone's history (a shallow clone)."""


def release_image(commit: str) -> str:
    return f"jobdist:{commit}"


def ensure_release(engine: Engine, commit: str) -> str:
    """The image of this repository at `commit`, built once: its own Dockerfile and
    sources, on the Python base; its tag. ReleaseMissing when git has no such commit."""
    archive = subprocess.run(["git", "-C", str(CHECKOUT), "archive", "--format=tar", commit],
                             capture_output=True, check=False, timeout=120)
    if archive.returncode != 0:
        raise ReleaseMissing(f"commit {commit} is not in this clone's history "
                             f"({archive.stderr.decode(errors='replace').strip()})")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        member = tar.extractfile("Dockerfile")
        assert member is not None
        dockerfile = release_dockerfile(member.read().decode())
    tag = release_image(commit)
    digest = hashlib.sha256(dockerfile.encode()).hexdigest()
    image = has_image(engine, tag)
    if image is not None and image.labels.get(DOCKERFILE_LABEL) == digest:
        return tag
    log.info("building %s from git archive %s", tag, commit)
    context = io.BytesIO(archive.stdout)
    with tarfile.open(fileobj=context, mode="a") as tar:
        info = tarfile.TarInfo(RELEASE_DOCKERFILE)
        info.size = len(dockerfile.encode())
        tar.addfile(info, io.BytesIO(dockerfile.encode()))
    context.seek(0)
    engine.client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True,
                               dockerfile=RELEASE_DOCKERFILE, network_mode="host",
                               labels={DOCKERFILE_LABEL: digest})
    return tag


def release_dockerfile(text: str) -> str:
    """A release's Dockerfile on the Python base, with the current image's health check
    where it has none (older releases kept it in docker-compose.yml)."""
    assert len(re.findall(r"^FROM ", text, re.MULTILINE)) == 1, "a single-stage build"
    text = re.sub(r"^FROM .*$", f"FROM {PYTHON_BASE}", text, flags=re.MULTILINE)
    if re.search(r"^HEALTHCHECK ", text, re.MULTILINE):
        return text
    current = (CHECKOUT / "Dockerfile").read_text()
    check = re.search(r"^HEALTHCHECK (?:.*\\\n)*.*$", current, re.MULTILINE)
    assert check is not None, "the Dockerfile's HEALTHCHECK"
    return f"{text.rstrip()}\n{check.group(0)}\n"


def image_size_mb(engine: Engine, name: str) -> float:
    return round(engine.client.images.get(name).attrs["Size"] / 1e6, 1)
