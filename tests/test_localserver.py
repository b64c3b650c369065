import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import requests

from jobdist.lab import localserver
from jobdist.lab.localserver import (
    REQUIRED_FIXES,
    LocalServer,
    ServerError,
    find_pouchdb_server,
    free_port,
    missing_fixes,
)

from .helpers import wait_for


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


def test_the_server_logs_warnings_only_and_nothing_to_stdout(tmp_path: Path) -> None:
    server = LocalServer(free_port(), tmp_path / "site")
    with server:
        for _ in range(20):
            requests.get(f"{server.url}/_all_dbs", timeout=5).raise_for_status()
        log_txt = server.data_dir / "log.txt"
        assert "_all_dbs" not in (log_txt.read_text() if log_txt.exists() else "")
        assert "_all_dbs" not in server.log_path.read_text()
    config = json.loads(server.config_path.read_text())
    assert config["log"]["level"] == "warning"
    assert config["pouchdb_server"]["no-stdout-logs"] is True


def test_the_local_cluster_restarts_a_site_server_that_dies(tmp_path: Path) -> None:
    import os
    import signal
    import time

    from jobdist.lab.cluster import LocalCluster
    from jobdist.lab.scenarios import write_sites

    cluster = LocalCluster(write_sites(tmp_path / "sites", 1), tmp_path / "state")
    cluster.up()
    try:
        site = cluster.sites["global"]
        url, login = site.couch.url, (site.couch.user, site.couch.password)
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


def test_cluster_up_again_starts_only_the_stopped_server_and_daemon(tmp_path: Path) -> None:
    """A site's server died (its supervisor, the pid `cluster status` shows, was killed)
    and another site's daemon: `jobdist cluster up` starts those two, nothing else."""
    import signal

    from click.testing import CliRunner

    from jobdist.cli import main
    from jobdist.lab.cluster import LocalCluster, Proc
    from jobdist.lab.scenarios import write_sites

    sites = write_sites(tmp_path / "sites", 2)
    dashboard_port = free_port()
    with open(sites / "reg_a.toml", "a") as config:
        config.write(f"\n[admin]\nport = {dashboard_port}\n")
    state = tmp_path / "state"
    args = ["--sites", str(sites), "--state", str(state)]
    first = CliRunner().invoke(main, ["cluster", "up", *args])
    cluster = LocalCluster(sites, state)
    try:
        assert first.exit_code == 0, first.output
        recorded = json.loads(cluster.state_file.read_text())["sites"]
        os.kill(recorded["global"]["server"]["pid"], signal.SIGTERM)  # stops its server
        os.kill(recorded["reg_a"]["daemon"]["pid"], signal.SIGKILL)
        url = cluster.sites["global"].couch.url
        wait_for(lambda: not Proc(**recorded["global"]["server"]).alive()
                 and not localserver.answers(url), what="global's server down")
        again = CliRunner().invoke(main, ["cluster", "up", *args])
        assert again.exit_code == 0, again.output
        assert again.output.startswith("started global server, reg_a daemon\n"), again.output
        assert localserver.answers(url)
        now = json.loads(cluster.state_file.read_text())["sites"]
        assert now["reg_a"]["server"] == recorded["reg_a"]["server"]  # left alone
        assert now["global"]["daemon"] == recorded["global"]["daemon"]
        assert requests.get(f"http://127.0.0.1:{dashboard_port}/status", timeout=5).ok
        status = CliRunner().invoke(main, ["cluster", "status", *args]).output
        assert f"dashboard http://127.0.0.1:{dashboard_port}/" in status
        assert status.count("running (pid") == 4, status
        assert sorted(path.name for path in (state / "journal").iterdir()) == ["global", "reg_a"]
        assert not (state / "global" / "journal").exists()  # the site's name once in a path
        idle = CliRunner().invoke(main, ["cluster", "up", *args])
        assert idle.output.startswith("every site is up already"), idle.output
    finally:
        cluster.down()


def test_a_server_start_interrupted_leaves_no_process_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Interrupted (Ctrl-C) while waiting for its first server to answer: the supervisor
    is not in the state file yet, so `down` cannot find it; `up` stops it itself."""
    from jobdist.lab import cluster as cluster_module
    from jobdist.lab.cluster import LocalCluster
    from jobdist.lab.scenarios import write_sites

    def interrupted(url: str) -> bool:
        raise KeyboardInterrupt

    monkeypatch.setattr(cluster_module, "answers", interrupted)
    cluster = LocalCluster(write_sites(tmp_path / "sites", 1), tmp_path / "state")
    with pytest.raises(KeyboardInterrupt):
        cluster.up()
    data = str(cluster.site_dir("global"))
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit()
                and data in _cmdline(int(pid))], "a server or its supervisor still runs"


def test_a_supervisor_told_to_stop_while_its_server_starts_stops_the_server(
        tmp_path: Path) -> None:
    """Told to stop (SIGTERM) while it waits for its server's first answer, a supervisor
    stops the server at once: it must not wait out the start, or the cluster SIGKILLs it
    after 15 s and the server, in a session of its own, outlives it."""
    server = LocalServer(free_port(), tmp_path / "couch", in_memory=True)
    stop = threading.Event()
    stop.set()
    with pytest.raises(ServerError, match="stopped while starting"):
        server.start(stop)
    assert server.process is None
    data = str(tmp_path / "couch")
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit()
                and data in _cmdline(int(pid))], "the server still runs"

def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""

# --- finding pouchdb-server, and the fixes `npm ci` applies ----------------------------

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PATCHES = PROJECT_ROOT / "patches"


def fake_installation(root: Path, fixed: set[str]) -> Path:
    """An npm tree whose files carry the fixes named in `fixed`; its pouchdb-server bin."""
    files: dict[Path, str] = {}
    for fix, relative, line in REQUIRED_FIXES:  # some files carry two fixes
        path = root / "node_modules" / relative
        files[path] = files.get(path, "") + (f"{line}\n" if fix in fixed else "// as published\n")
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    binary = root / "node_modules" / "pouchdb-server" / "bin" / "pouchdb-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("")
    return binary


def test_a_server_without_a_fix_is_refused_before_it_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = REQUIRED_FIXES[1][0]
    present = {fix for fix, _, _ in REQUIRED_FIXES} - {missing}
    monkeypatch.setenv("JOBDIST_POUCHDB_SERVER", str(fake_installation(tmp_path, present)))
    server = LocalServer(free_port(), tmp_path / "site")
    with pytest.raises(ServerError) as refused:
        server.start()
    message = str(refused.value)
    assert "\n" not in message
    assert missing in message and "npm ci" in message
    assert not any(fix in message for fix in present)
    assert server.process is None


def test_the_installed_server_has_every_fix() -> None:
    assert missing_fixes(find_pouchdb_server()) == []


def test_no_server_found_says_how_to_install_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOBDIST_POUCHDB_SERVER", raising=False)
    monkeypatch.setattr(localserver, "CHECKOUT", tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServerError, match=r"npm ci.*JOBDIST_POUCHDB_SERVER"):
        find_pouchdb_server()
    monkeypatch.setenv("JOBDIST_POUCHDB_SERVER", str(tmp_path / "nowhere"))
    with pytest.raises(ServerError, match=r"JOBDIST_POUCHDB_SERVER=.*nowhere: no such file"):
        find_pouchdb_server()


def test_every_checked_fix_is_one_the_patches_write() -> None:
    added = {line[1:].strip() for patch in PATCHES.glob("*.patch")
             for line in patch.read_text().splitlines() if line.startswith("+")}
    assert {line for _, _, line in REQUIRED_FIXES} <= added


def run_patches(project: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["node", str(project / "patches" / "apply.js")], text=True,
                          capture_output=True, timeout=60)


def test_the_patches_match_the_installed_server(tmp_path: Path) -> None:
    # On copies of the installed files: every hunk is found there, already applied.
    binary = find_pouchdb_server()
    shutil.copytree(PATCHES, tmp_path / "patches")
    for _, relative, _ in REQUIRED_FIXES:
        installed = localserver.node_resolve(binary.resolve().parent, relative)
        assert installed is not None
        (tmp_path / "node_modules" / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(installed, tmp_path / "node_modules" / relative)
    applied = run_patches(tmp_path)
    assert applied.returncode == 0, applied.stderr
    lines = applied.stdout.splitlines()
    assert len(lines) == len(list(PATCHES.glob("*.patch")))  # each patch changes one file
    assert all(line.endswith("already patched") for line in lines), applied.stdout


PATCH = """Why: a sample.

--- a/node_modules/pkg/lib.js
+++ b/node_modules/pkg/lib.js
@@ -1,3 +1,4 @@
 function f() {
-  return 1;
+  // fixed
+  return 2;
 }
"""


def test_apply_patches_once_and_refuses_what_does_not_match(tmp_path: Path) -> None:
    (tmp_path / "patches").mkdir()
    shutil.copy(PATCHES / "apply.js", tmp_path / "patches")
    (tmp_path / "patches" / "pkg+1.0.0.patch").write_text(PATCH)
    target = tmp_path / "node_modules" / "pkg" / "lib.js"
    target.parent.mkdir(parents=True)
    target.write_text("// head\nfunction f() {\n  return 1;\n}\n")
    assert run_patches(tmp_path).returncode == 0
    assert target.read_text() == "// head\nfunction f() {\n  // fixed\n  return 2;\n}\n"
    again = run_patches(tmp_path)
    assert again.returncode == 0 and "already patched" in again.stdout
    target.write_text("function f() {\n  return 3;\n}\n")
    refused = run_patches(tmp_path)
    assert refused.returncode == 1
    assert refused.stderr.strip().count("\n") == 0 and "matches nothing" in refused.stderr


def test_free_port_never_hands_out_a_port_twice_nor_one_a_connection_may_take() -> None:
    # The kernel's own pick repeats within a few hundred calls once ports are released,
    # and its range is the one outgoing connections take their ports from: either let
    # a proxy take a site server's port in a fault storm.
    low, _ = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_port() for _ in range(600)]
    assert len(set(ports)) == len(ports)
    assert all(port < low for port in ports)


def test_a_kept_login_is_forgotten_when_its_user_or_admin_changes(tmp_path: Path) -> None:
    # The server keeps basic-auth sessions (patches/express-pouchdb+4.2.0.auth.patch):
    # a changed or removed password must be refused as soon as its change is answered.
    # On disk, where a review found a first version honouring the old password for a
    # few ms after the answer in about half the rounds.
    with LocalServer(free_port(), tmp_path / "site", admin=("admin", "pw-admin")) as server:
        admin = ("admin", "pw-admin")

        def status(auth: tuple[str, str]) -> int:
            return requests.get(f"{server.url}/_session", auth=auth, timeout=5).status_code

        user = f"{server.url}/_users/org.couchdb.user:bob"
        doc = {"name": "bob", "password": "pw-0", "roles": [], "type": "user"}
        rev = requests.put(user, json=doc, auth=admin, timeout=5).json()["rev"]
        for round in range(1, 21):
            assert [status(("bob", f"pw-{round - 1}")) for _ in range(2)] == [200, 200]
            rev = requests.put(user, json={**doc, "password": f"pw-{round}", "_rev": rev},
                               auth=admin, timeout=5).json()["rev"]
            assert status(("bob", f"pw-{round - 1}")) == 401, f"round {round}"
        assert status(("bob", "pw-20")) == 200
        requests.delete(f"{user}?rev={rev}", auth=admin, timeout=5).raise_for_status()
        assert status(("bob", "pw-20")) == 401

        second = f"{server.url}/_config/admins/carol"
        requests.put(second, json="first", auth=admin, timeout=5).raise_for_status()
        assert [status(("carol", "first")) for _ in range(3)] == [200, 200, 200]
        requests.put(second, json="second", auth=admin, timeout=5).raise_for_status()
        assert status(("carol", "first")) == 401
        assert status(("carol", "second")) == 200
        requests.delete(second, auth=("carol", "second"), timeout=5).raise_for_status()
        assert status(("carol", "second")) == 401
        assert status(admin) == 200
