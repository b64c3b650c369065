"""Security: credentials, authentication on real servers, and the command allow-list.

The local cluster runs with authentication on (no admin party): an admin that
only setup uses, a user per site, the jobs database locked to the site users.
Passwords must never show in logs, errors, /status or job documents.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from jobdist.config import ConfigError, ensure_credentials, load_site, load_sites
from jobdist.couch import Couch, Forbidden
from jobdist.daemon import Daemon
from jobdist.lab.cluster import LocalCluster
from jobdist.lab.scenarios import site_db, wait_until_done, write_sites
from jobdist.model import new_job, new_step
from jobdist.secret_files import write_credentials
from jobdist.setup import setup_sites
from jobdist.step_run import run_step

from .helpers import README

ADMIN_TOKEN = "admin-token-of-the-test"


def write_site(directory: Path, body: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "solo.toml"
    path.write_text(f'name = "solo"\n{body}\n[couch]\nurl = "http://127.0.0.1:5999"\n'
                    'credentials = "secrets/solo.toml"\n')
    return path


# --- credentials -----------------------------------------------------------------------------


def test_credentials_file_is_read_relative_to_the_config(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("JOBDIST_COUCH_USER", "JOBDIST_COUCH_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    path = write_site(tmp_path, "")
    write_credentials(tmp_path / "secrets" / "solo.toml", "jobdist_solo", 'pa"ss\\word')
    site = load_site(path)
    assert (site.couch.user, site.couch.password) == ("jobdist_solo", 'pa"ss\\word')
    assert stat.S_IMODE((tmp_path / "secrets").stat().st_mode) == 0o700
    assert 'pa"ss' not in repr(site)


def test_a_credentials_file_others_may_read_is_refused(tmp_path: Path) -> None:
    path = write_site(tmp_path, "")
    secret = tmp_path / "secrets" / "solo.toml"
    write_credentials(secret, "jobdist_solo", "hunter22")
    os.chmod(secret, 0o644)
    with pytest.raises(ConfigError, match=r"may be read by others.*chmod 600") as raised:
        load_site(path)
    assert "hunter22" not in str(raised.value)


def test_a_broken_credentials_file_is_not_echoed(tmp_path: Path) -> None:
    path = write_site(tmp_path, "")
    secret = tmp_path / "secrets" / "solo.toml"
    write_credentials(secret, "jobdist_solo", "hunter22")
    secret.write_text('user = "jobdist_solo"\npasword = "hunter22"\n')
    with pytest.raises(ConfigError, match="must hold `user` and `password`") as raised:
        load_site(path)
    assert "hunter22" not in str(raised.value)


def test_the_environment_overrides_files_site_by_site(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_site(tmp_path, "")
    write_credentials(tmp_path / "secrets" / "solo.toml", "from_file", "file-password")
    monkeypatch.setenv("JOBDIST_COUCH_USER", "generic")
    monkeypatch.setenv("JOBDIST_COUCH_PASSWORD_SOLO", "site-password")
    site = load_site(path)
    assert (site.couch.user, site.couch.password) == ("generic", "site-password")


def test_the_admin_token_file_is_written_once_private_and_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOBDIST_ADMIN_TOKEN", raising=False)
    write_site(tmp_path, "")
    with open(tmp_path / "solo.toml", "a") as config:
        config.write('\n[admin]\nport = 0\ntoken_file = "secrets/admin-token"\n')
    token_file = tmp_path / "secrets" / "admin-token"
    [site] = ensure_credentials(load_sites(tmp_path), tmp_path).values()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    assert len(token) >= 32 and site.admin.token == token
    ensure_credentials(load_sites(tmp_path), tmp_path)
    assert token_file.read_text().strip() == token  # kept, never replaced
    monkeypatch.setenv("JOBDIST_ADMIN_TOKEN", "from-the-environment")
    assert load_site(tmp_path / "solo.toml").admin.token == "from-the-environment"
    monkeypatch.delenv("JOBDIST_ADMIN_TOKEN")
    token_file.chmod(0o644)
    with pytest.raises(ConfigError, match=r"admin token file .* may be read by others"):
        load_site(tmp_path / "solo.toml")


def test_the_local_sites_name_an_admin_token_file_in_the_secrets() -> None:
    root = README.parent
    for directory in (root / "sites", root / "sites" / "star"):
        for site in load_sites(directory).values():
            assert site.admin.token_file is not None, site.name
            assert site.admin.token_file.resolve() == root / ".jobdist/secrets/admin-token"


def test_allow_list_patterns_are_checked_when_loaded(tmp_path: Path) -> None:
    site = load_site(write_site(tmp_path / "ok", '[commands]\nallow = ["rsync .*", "true"]\n'))
    assert site.commands.allows("rsync -a /a /b") and site.commands.allows("true")
    assert not site.commands.allows("rm -rf /") and not site.commands.allows("true; rm -rf /")
    assert load_site(write_site(tmp_path / "all", "")).commands.allows("anything at all")
    with pytest.raises(ConfigError, match="bad pattern"):
        load_site(write_site(tmp_path / "bad", '[commands]\nallow = ["rsync ("]\n'))


@pytest.mark.parametrize("command", ["rsync a b; curl x | sh", "rsync $(id) b", "rsync a `id`",
                                     "rsync a b > /etc/passwd", "rsync a b\nreboot",
                                     "rsync a b & reboot"])
def test_shell_operators_need_allow_shell(tmp_path: Path, command: str) -> None:
    strict = load_site(write_site(tmp_path / "strict", '[commands]\nallow = ["rsync .*"]\n'))
    assert strict.commands.allows("rsync -a /a /b") and not strict.commands.allows(command)
    shell = load_site(write_site(tmp_path / "shell",
                                 '[commands]\nallow = ["rsync .*"]\nallow_shell = true\n'))
    assert shell.commands.allows(command) == ("\n" not in command)  # `.` never matches a newline


def test_a_missing_credentials_file_stops_setup_and_the_daemon(tmp_path: Path) -> None:
    site = load_site(write_site(tmp_path, ""))  # names secrets/solo.toml, never written
    with pytest.raises(ConfigError, match=r"does not exist: run `jobdist secrets`"):
        setup_sites({"solo": site})
    with pytest.raises(ConfigError, match="does not exist"):
        Daemon(site)


def test_steps_do_not_inherit_the_daemons_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBDIST_COUCH_PASSWORD", "pw-of-the-daemon")
    monkeypatch.setenv("JOBDIST_COUCH_ADMIN_PASSWORD_GLOBAL", "pw-of-the-admin")
    monkeypatch.setenv("JOBDIST_ADMIN_TOKEN", "token-of-the-daemon")
    monkeypatch.setenv("UNRELATED_SETTING", "kept")
    result = run_step(new_step("env"), {"JOBDIST_SITE": "solo"})
    assert result.ok and "UNRELATED_SETTING=kept" in result.stdout
    assert "JOBDIST_SITE=solo" in result.stdout
    for secret in ("pw-of-the-daemon", "pw-of-the-admin", "token-of-the-daemon"):
        assert secret not in result.stdout


# --- the allow-list in the worker ------------------------------------------------------------


def test_a_refused_command_never_runs_nor_retries(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    step = new_step(f"touch {marker}", max_retries=3, sleep=0.01)
    result = run_step(step, {}, allows=lambda command: command == "true")
    assert not result.ok and result.attempts == 1 and not marker.exists()
    assert "allow list" in result.reason


def test_an_allowed_alt_do_runs_after_a_refused_do(tmp_path: Path) -> None:
    step = new_step("rm -rf /tmp/nothing-here", alt_do="true")
    result = run_step(step, {}, allows=lambda command: command == "true")
    assert result.ok and result.used_alt
    assert "refused" in result.reason


# --- a local cluster with authentication on ---------------------------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("secured")
    sites_dir = write_sites(root / "sites", 2, keepalive=2.0)
    with open(sites_dir / "reg_a.toml", "a") as config:  # reg_a runs only `echo ...`
        config.write('\n[commands]\nallow = ["echo [a-z ]*"]\n')
    with open(sites_dir / "global.toml", "a") as config:
        config.write(f'\n[admin]\nport = 0\ntoken = "{ADMIN_TOKEN}"\n')
    with LocalCluster(sites_dir, root / "state", in_memory=True) as cluster:
        yield cluster


def test_server_data_only_its_owner_reads(secured: LocalCluster) -> None:
    """The servers' files hold the replications' URLs, with passwords in them."""
    assert stat.S_IMODE(secured.state_dir.stat().st_mode) == 0o700
    for name in secured.sites:
        data = secured.site_dir(name) / "couch"
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        assert stat.S_IMODE((data / "config.json").stat().st_mode) & 0o077 == 0


def test_a_site_leaves_a_step_it_would_refuse_to_a_site_that_runs_it(
        secured: LocalCluster) -> None:
    db = site_db(secured, "reg_a")  # reg_a creates the job and may only run `echo ...`
    job = new_job("reg_a", [new_step("printf 'ran elsewhere'", target="any")])
    db.save(job)
    [done] = wait_until_done(db, [job["_id"]], 60)
    assert done["job_status"] == "success"
    assert done["job"][0]["winner"] == "global"


def test_generated_secrets_only_their_owner_reads(secured: LocalCluster) -> None:
    secrets_dir = secured.sites_dir / "secrets"
    assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
    files = sorted(path.name for path in secrets_dir.iterdir())
    assert files == ["admin.toml", "global.toml", "reg_a.toml"]
    for path in secrets_dir.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_nobody_without_credentials_reads_or_writes(secured: LocalCluster) -> None:
    site = secured.sites["global"]
    url = f"{site.couch.url}/{site.couch.database}"
    assert requests.get(f"{url}/_all_docs", timeout=10).status_code == 401
    assert requests.put(f"{url}/intruder", json={}, timeout=10).status_code == 401
    assert requests.get(f"{url}/_all_docs", auth=(site.couch.user, "wrong"),
                        timeout=10).status_code == 401
    # Anonymous database creation once crashed pouchdb-server (patched in localserver).
    assert requests.put(f"{site.couch.url}/newdb", timeout=10).status_code == 401
    assert requests.get(site.couch.url, timeout=10).status_code == 200


def test_a_site_user_works_jobs_but_administers_nothing(secured: LocalCluster) -> None:
    site = secured.sites["global"]
    couch = Couch(site.couch.url, user=site.couch.user, password=site.couch.password, retries=1)
    assert couch.session_user() == site.couch.user
    db = couch.database(site.couch.database)
    assert db.get("_design/jobdist") is not None
    with pytest.raises(Forbidden):
        db.save({"_id": "_design/mine", "views": {}})
    with pytest.raises(Forbidden):
        db.put_security({"members": {"names": [], "roles": []}})
    with pytest.raises(Forbidden):
        couch.ensure_database("another")


def test_setup_again_changes_nothing(secured: LocalCluster) -> None:
    assert setup_sites(load_sites(secured.sites_dir)) == 0


def test_jobs_run_across_sites_and_no_password_leaks(secured: LocalCluster) -> None:
    db = site_db(secured, "global")
    job = new_job("global", [new_step("echo hello", target="reg_a"),
                             new_step("echo world", target="global")])
    db.save(job)
    [done] = wait_until_done(db, [job["_id"]], 60)
    assert done["job_status"] == "success"
    status = requests.get(f"http://127.0.0.1:{admin_port(secured)}/status", timeout=10).text
    passwords = {s.couch.password for s in secured.sites.values()} | {
        s.couch.admin_password for s in secured.sites.values()}
    texts = [status, str(done), *(p.read_text(errors="replace")
                                  for p in secured.state_dir.rglob("*") if p.is_file()
                                  and p.suffix in (".log", ".err", ".json", ""))]
    for password in passwords:
        assert password and not any(password in text for text in texts)


def admin_port(cluster: LocalCluster) -> int:
    """The port the global daemon's admin endpoint took (port 0: it logs the one it got)."""
    log = (cluster.site_dir("global") / "daemon.log").read_text()
    line = next(line for line in log.splitlines() if "admin endpoint" in line)
    return int(line.rsplit(":", 1)[1].split()[0].rstrip("/"))


def test_a_step_outside_the_allow_list_fails_with_the_reason(secured: LocalCluster) -> None:
    db = site_db(secured, "global")
    job = new_job("global", [new_step("touch /tmp/jobdist-should-not-exist", target="reg_a")])
    db.save(job)
    [done] = wait_until_done(db, [job["_id"]], 60)
    assert done["job_status"] == "failed"
    failed = [entry for entry in done["history"] if entry["event"] == "failed"]
    assert failed and "allow list" in failed[0]["detail"]
    assert not Path("/tmp/jobdist-should-not-exist").exists()


def test_a_wrong_password_is_one_line_without_the_password(secured: LocalCluster,
                                                           tmp_path: Path) -> None:
    env = {**os.environ, "JOBDIST_COUCH_PASSWORD": "not-the-password-42"}
    result = subprocess.run([sys.executable, "-m", "jobdist", "list", "--sites",
                             str(secured.sites_dir)], capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "401" in result.stderr and "credentials" in result.stderr
    assert "not-the-password-42" not in result.stderr + result.stdout


def test_the_admin_endpoint_refuses_writes_without_the_token(secured: LocalCluster) -> None:
    url = f"http://127.0.0.1:{admin_port(secured)}"
    assert requests.post(f"{url}/workers", json={"size": 1}, timeout=10).status_code == 401


def test_secrets_command_writes_once_and_never_overwrites(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from jobdist.cli import main

    sites = write_sites(tmp_path / "sites", 2)
    env_file = tmp_path / ".env"
    first = CliRunner().invoke(main, ["secrets", "--sites", str(sites), "--compose-env",
                                      str(env_file)])
    assert first.exit_code == 0, first.output
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    names = [line.split("=", 1)[0] for line in env_file.read_text().splitlines()]
    assert names == ["COUCHDB_PASSWORD", "JOBDIST_ADMIN_TOKEN", "JOBDIST_PASSWORD_GLOBAL",
                     "JOBDIST_PASSWORD_REG_A"]
    assert stat.S_IMODE((sites / "secrets" / "global.toml").stat().st_mode) == 0o600
    before = env_file.read_text()
    again = CliRunner().invoke(main, ["secrets", "--sites", str(sites), "--compose-env",
                                      str(env_file)])
    assert again.exit_code == 2 and "exists already" in again.output
    assert env_file.read_text() == before
