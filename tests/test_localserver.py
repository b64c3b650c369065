from pathlib import Path

import requests

from jobdist.localserver import LocalServer, free_port


def test_server_starts_persists_restarts_and_stops(tmp_path: Path) -> None:
    server = LocalServer(free_port(), tmp_path / "site")
    with server:
        pid = server.pid
        assert requests.get(server.url, timeout=5).json()["version"]
        requests.put(f"{server.url}/jobs", timeout=5).raise_for_status()
        requests.put(f"{server.url}/jobs/a", json={"x": 1}, timeout=5).raise_for_status()
        server.kill()
        assert not server.is_alive()
        assert server.ensure_running() is True
        assert server.pid != pid
        # LevelDB on disk: the document survived the crash.
        assert requests.get(f"{server.url}/jobs/a", timeout=5).json()["x"] == 1
    assert not server.is_alive()
    assert server.pid is None
