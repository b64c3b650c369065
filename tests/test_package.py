"""jobdist as a package: a wheel, installed in a fresh venv, works from any directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from jobdist.design import load_design_docs
from jobdist.lab.localserver import LocalServer, free_port

pytestmark = pytest.mark.e2e

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# What the build reads (the Dockerfile copies the same): a copy, so that no build/ left
# in the checkout by an earlier build can put stale files in the wheel.
SOURCES = ("pyproject.toml", "README.md", "jobdist", "couch_design")
JOB = "job:\n  - do: make\n    target: any\n  - do: make test\n    target: any\n"


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    # No PYTHONPATH: it could point the venv at the checkout's jobdist.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.pop("JOBDIST_POUCHDB_SERVER", None)
    return subprocess.run([str(arg) for arg in args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=300)


def checked(*args: str | Path, cwd: Path) -> str:
    result = run(*args, cwd=cwd)
    assert result.returncode == 0, f"{args}: {result.stdout}{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        path = PROJECT_ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, source / name)
    dist = tmp_path_factory.mktemp("dist")
    checked(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, source,
            cwd=dist)
    [built] = dist.glob("jobdist-*.whl")
    return built


def running_site_packages() -> list[str]:
    """Where this interpreter finds its installed packages: its venv's when it runs in
    one (which `--system-site-packages` would not see), else the system's."""
    return [path for path in sys.path if Path(path).name in ("site-packages", "dist-packages")]


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the wheel; the running interpreter's packages give the dependencies,
    named in a .pth file: searched after the venv's own, and their own .pth files (an
    editable jobdist's finder) are not run."""
    venv = tmp_path_factory.mktemp("venv")
    checked(sys.executable, "-m", "venv", venv, cwd=venv)
    python = venv / "bin" / "python"
    purelib = checked(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                      cwd=venv).strip()
    (Path(purelib) / "running-interpreter.pth").write_text(
        "".join(f"{path}\n" for path in running_site_packages()))
    checked(python, "-m", "pip", "install", "-q", "--no-deps", wheel, cwd=venv)
    return venv


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory with no checkout in sight."""
    directory = tmp_path / "elsewhere"
    directory.mkdir()
    return directory


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalServer]:
    with LocalServer(free_port(), tmp_path / "couch", in_memory=True) as server:
        yield server  # stopped by pid on the way out, the test failed or not


def test_the_wheel_carries_every_design_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    design = PROJECT_ROOT / "couch_design"
    for path in design.rglob("*.js"):
        assert f"jobdist/couch_design/{path.relative_to(design).as_posix()}" in names


def test_the_wheel_carries_the_dashboards_templates_and_script(wheel: Path,
                                                              venv: Path, elsewhere: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    package = PROJECT_ROOT / "jobdist"
    shipped = [*package.glob("templates/*.html"), *package.glob("static/*")]
    assert len(shipped) >= 7
    for path in shipped:
        assert f"jobdist/{path.relative_to(package).as_posix()}" in names
    # The installed package finds them: a page renders, the script is read.
    rendered = checked(venv / "bin" / "python", "-c",
                       "from jinja2 import Environment, PackageLoader; "
                       "from importlib.resources import files; "
                       "env = Environment(loader=PackageLoader('jobdist', 'templates')); "
                       "print(env.get_template('fragment.html').render()); "
                       "print(len(files('jobdist').joinpath('static', 'dashboard.js')"
                       ".read_bytes()))", cwd=elsewhere)
    assert int(rendered.split()[-1]) > 1000


def test_the_venv_runs_the_wheel_not_the_checkout(venv: Path, elsewhere: Path) -> None:
    found = checked(venv / "bin" / "python", "-c",
                    "import jobdist, jobdist.design as d; print(jobdist.__file__); "
                    "print(d.design_dir())", cwd=elsewhere).splitlines()
    site_packages = str(venv / "lib")
    assert all(line.startswith(site_packages) or f"'{site_packages}" in line
               for line in found), found


def test_validate_from_another_directory(venv: Path, elsewhere: Path) -> None:
    (elsewhere / "job.yaml").write_text(JOB)
    assert "ok" in checked(venv / "bin" / "jobdist", "validate", "job.yaml", cwd=elsewhere)


def test_setup_installs_the_design_documents(venv: Path, elsewhere: Path,
                                             server: LocalServer) -> None:
    (elsewhere / "sites").mkdir()
    (elsewhere / "sites" / "solo.toml").write_text(
        f'name = "solo"\n[couch]\nurl = "{server.url}"\ndatabase = "jobs"\n')
    output = checked(venv / "bin" / "jobdist", "setup", cwd=elsewhere)
    assert "solo: wrote _design/jobdist" in output
    installed = requests.get(f"{server.url}/jobs/_design/jobdist", timeout=10).json()
    expected = next(doc for doc in load_design_docs() if doc["_id"] == "_design/jobdist")
    for field in ("validate_doc_update", "views", "filters"):
        assert installed[field] == expected[field]


def test_no_local_server_is_one_line_naming_npm_ci(venv: Path, elsewhere: Path) -> None:
    # No node_modules beside an installed package, nor here: the user is told what to do.
    (elsewhere / "sites").mkdir()
    (elsewhere / "sites" / "solo.toml").write_text(
        f'name = "solo"\n[couch]\nurl = "http://127.0.0.1:{free_port()}"\n')
    result = run(venv / "bin" / "jobdist", "cluster", "up", cwd=elsewhere)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "npm ci" in result.stderr, result.stderr
    assert not (elsewhere / ".jobdist").exists()
