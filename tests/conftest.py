"""Shared fixtures: real pouchdb-server processes, started and always stopped by pid."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from jobdist.lab.cluster import interrupt_on_sigterm
from jobdist.lab.localserver import LocalServer, free_port


def pytest_configure(config: pytest.Config) -> None:
    # A run stopped with SIGTERM (a CI timeout) unwinds as Ctrl-C does: fixtures and
    # `finally` blocks stop every server and daemon the tests started.
    interrupt_on_sigterm()


def journals_here() -> set[Path]:
    """The journal directories under the working directory's .jobdist (the default)."""
    return set(Path(".jobdist").glob("journal/*")) | set(Path(".jobdist").glob("*/journal"))


@pytest.fixture(scope="session", autouse=True)
def nothing_left_in_the_working_directory() -> Iterator[None]:
    """Tests keep their files in tmp dirs: a site without `[daemon] journal` keeps its
    journal, and its steps' progress files, in the working directory, the checkout
    (give the config a tmp journal: helpers.in_tmp)."""
    before = journals_here()
    yield
    left = sorted(map(str, journals_here() - before))
    assert not left, f"tests left journals in the working directory: {left}"


@pytest.fixture(scope="session")
def couch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    """One in-memory pouchdb-server for the whole session (tests use their own databases)."""
    server = LocalServer(free_port(), tmp_path_factory.mktemp("couch"), in_memory=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def db_url(couch_server: LocalServer) -> Iterator[str]:
    """The URL of a new, empty database on the session server; deleted afterwards."""
    url = f"{couch_server.url}/t_{uuid.uuid4().hex[:12]}"
    requests.put(url, timeout=10).raise_for_status()
    try:
        yield url
    finally:
        requests.delete(url, timeout=10)
