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


def test_the_local_cluster_restarts_a_site_server_that_dies(tmp_path: Path) -> None:
    import os
    import signal
    import time

    from jobdist.cluster import LocalCluster
    from jobdist.scenarios import write_sites

    cluster = LocalCluster(write_sites(tmp_path / "sites", 1), tmp_path / "state")
    cluster.up()
    try:
        site = cluster.sites["global"]
        url, login = site.couch_url, (site.user, site.password)
        requests.put(f"{url}/jobs/kept", json={"type": "note"}, auth=login, timeout=5)
        first = cluster.server_pid("global")
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:
            try:
                if cluster.server_pid("global") != first and requests.get(url, timeout=1).ok:
                    break
            except (requests.RequestException, ValueError, OSError):
                pass
            assert time.monotonic() < deadline, "the server was not restarted"
            time.sleep(0.1)
        # Data on disk kept, the admin and the users too.
        assert requests.get(f"{url}/jobs/_design/jobdist", auth=login, timeout=5).ok
    finally:
        stopped = cluster.down()
    assert any("server" in line for line in stopped)
    assert not Path(f"/proc/{cluster.server_pid('global')}/stat").exists() or "Z" in Path(
        f"/proc/{cluster.server_pid('global')}/stat").read_text().rsplit(")", 1)[1].split()[0]
