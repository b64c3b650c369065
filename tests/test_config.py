"""Site configs are strict: an unknown key is refused with the nearest known one."""

from __future__ import annotations

import dataclasses
import logging
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from jobdist.config import (
    SECTIONS,
    SETTINGS,
    ConfigError,
    SiteConfig,
    SuccessionSettings,
    load_site,
    load_sites,
)
from jobdist.lab.scenarios import TOPOLOGIES, write_sites

PROJECT_ROOT = Path(__file__).resolve().parent.parent
BASE = 'name = "solo"\n[couch]\nurl = "http://127.0.0.1:5999"\n'


def write_config(directory: Path, text: str) -> Path:
    path = directory / "solo.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "message"), [
    (BASE + "[deamon]\nlease = 5.0\n", "unknown setting 'deamon' (did you mean 'daemon'?)"),
    (BASE + "[daemon]\nleese = 5.0\n",
     "unknown setting 'daemon.leese' (did you mean 'daemon.lease'?)"),
    ("wrkers = 3\n" + BASE, "unknown setting 'wrkers' (did you mean 'workers'?)"),
    (BASE + "[couch.tls]\nverify = true\n", "unknown setting 'couch.tls'"),
    ("colour = 'red'\n" + BASE, "unknown setting 'colour'"),
    # A key in the wrong place: the place where it belongs.
    ("lease = 5.0\n" + BASE, "unknown setting 'lease' (did you mean 'daemon.lease'?)"),
    (BASE + "workers = 3\n", "unknown setting 'couch.workers' (did you mean 'workers'?)"),
], ids=["section", "key", "top-level", "subsection", "no-hint", "belongs-in-daemon",
        "belongs-at-top"])
def test_an_unknown_setting_is_refused_with_a_hint(tmp_path: Path, text: str,
                                                   message: str) -> None:
    path = write_config(tmp_path, text)
    with pytest.raises(ConfigError) as raised:
        load_site(path)
    assert str(raised.value) == f"{path}: {message}"


def test_every_unknown_setting_is_named_on_one_line(tmp_path: Path) -> None:
    path = write_config(tmp_path, "colour = 1\n" + BASE + "[admin]\nprot = 7984\n")
    with pytest.raises(ConfigError) as raised:
        load_site(path)
    assert str(raised.value) == (f"{path}: unknown setting 'colour'; unknown setting "
                                 "'admin.prot' (did you mean 'admin.port'?)")


def test_the_start_write_delay_is_never_negative_and_at_most_a_quarter_of_the_lease(
        tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("tuning.start_write_delay (-1.0) must be")):
        load_site(write_config(tmp_path, BASE + "[tuning]\nstart_write_delay = -1.0\n"))
    site = load_site(write_config(tmp_path, BASE + "[daemon]\nlease = 2.0\n"))
    assert (site.tuning.start_write_delay, site.timings.start_delay) == (1.0, 0.5)


@pytest.mark.parametrize(("text", "message"), [
    ("[daemon]\nlease = 0\n", "daemon.lease (0.0) must be above 0"),
    ("[daemon]\nlease = 10\n[tuning]\nheartbeat = 6\n",
     "tuning.heartbeat (6.0) must be above 0 and at most half of daemon.lease (10.0)"),
    ("[tuning]\nheartbeat = 0\n", "tuning.heartbeat (0.0) must be above 0"),
])
def test_timings_that_break_a_relation_are_refused(tmp_path: Path, text: str,
                                                    message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_site(write_config(tmp_path, BASE + text))


@pytest.mark.parametrize(("text", "message"), [
    ("workers = -1\n" + BASE, "workers: must be an integer >= 0, not -1"),
    ("workers = 2.5\n" + BASE, "workers: must be an integer >= 0, not 2.5"),
    ('peers = "reg_b"\n' + BASE, "peers: must be a list of site names, not 'reg_b'"),
    ('name = "Solo"\n[couch]\nurl = "http://127.0.0.1:5999"\n',
     "name: 'Solo' must be 1-64 of a-z, 0-9, _ and -"),
    ('[couch]\nurl = "http://127.0.0.1:5999"\n', "missing setting 'name'"),
], ids=["workers-negative", "workers-fraction", "peers-not-a-list", "name-case", "no-name"])
def test_a_top_level_setting_is_read_by_its_type(tmp_path: Path, text: str,
                                                 message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_site(write_config(tmp_path, text))
    assert str(raised.value) == f"{tmp_path / 'solo.toml'}: {message}"


def test_the_heartbeat_follows_the_lease_unless_tuned(tmp_path: Path) -> None:
    """A shorter lease alone is a valid config: the heartbeat is derived from it."""
    site = load_site(write_config(tmp_path, BASE + "[daemon]\nlease = 8.0\n"))
    assert (site.tuning.heartbeat, site.timings.heartbeat) == (None, 2.0)
    tuned = load_site(write_config(tmp_path, BASE + "[daemon]\nlease = 8.0\n"
                                   "[tuning]\nheartbeat = 3.0\n"))
    assert tuned.timings.heartbeat == 3.0


# The keys [tuning] took over, in their old place (read for one release), and where they
# are read into now.
OLD_KEYS = [("daemon", "booking_timeout", 7.0, "booking_timeout"),
            ("daemon", "heartbeat", 5.0, "heartbeat"),
            ("daemon", "start_write_delay", 0.5, "start_write_delay"),
            ("keepalive", "period", 1.0, "keepalive_period"),
            ("keepalive", "stale_after", 9.0, "keepalive_stale_after")]


@pytest.mark.parametrize(("section", "key", "value", "new_key"), OLD_KEYS)
def test_a_setting_tuning_took_over_is_still_read_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, section: str, key: str,
        value: float, new_key: str) -> None:
    path = write_config(tmp_path, BASE + f"[{section}]\n{key} = {value}\n")
    with caplog.at_level(logging.WARNING, "jobdist.config"):
        site = load_site(path)
        assert load_site(path) == site  # (`site run` reads it twice: warned once)
    assert getattr(site.tuning, new_key) == value
    assert caplog.messages == [f"deprecated setting, read until 0.2 only site=solo "
                               f"setting={section}.{key} "
                               f"write_as=tuning.{new_key} config={path}"]


def test_a_setting_in_its_old_and_new_place_is_refused(tmp_path: Path) -> None:
    text = BASE + "[keepalive]\nperiod = 1.0\n[tuning]\nkeepalive_period = 2.0\n"
    with pytest.raises(ConfigError, match=re.escape(
            "keepalive.period and tuning.keepalive_period are the same setting")):
        load_site(write_config(tmp_path, text))


def test_an_old_section_with_an_unknown_key_is_still_refused(tmp_path: Path) -> None:
    text = BASE + "[keepalive]\nperiod = 1.0\nperod = 2.0\n"
    with pytest.raises(ConfigError, match=re.escape("unknown setting 'keepalive'")):
        load_site(write_config(tmp_path, text))


def test_a_section_must_be_a_table(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("daemon must be a table ([daemon]), not 5")):
        load_site(write_config(tmp_path, "daemon = 5\n" + BASE))


def test_a_missing_setting_is_named_with_its_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("missing setting 'couch.url'")):
        load_site(write_config(tmp_path, 'name = "solo"\n[couch]\ndatabase = "jobs"\n'))


def test_the_daemon_journal_is_a_known_setting(tmp_path: Path) -> None:
    config = BASE + '[daemon]\njournal = "/var/lib/jobdist/journal"\n'
    site = load_site(write_config(tmp_path, config))
    # One directory a site: sites that share a host and a configured path never share one.
    assert site.journal_dir() == Path("/var/lib/jobdist/journal") / site.name
    # Unset, the same rule from the working directory: the site's name once in the path.
    assert load_site(write_config(tmp_path, BASE)).journal_dir() == Path(".jobdist/journal/solo")


@pytest.mark.parametrize("directory", ["sites", "sites/star", "sites/compose"])
def test_the_shipped_configs_load(directory: str) -> None:
    assert len(load_sites(PROJECT_ROOT / directory)) == 3


def default_of(cls: type, key: str) -> Any:
    item = next(item for item in dataclasses.fields(cls) if item.name == key)
    return item.default_factory() if item.default_factory is not dataclasses.MISSING \
        else item.default


@pytest.mark.parametrize("path", sorted(PROJECT_ROOT.glob("sites/**/*.toml")),
                         ids=lambda path: str(path.relative_to(PROJECT_ROOT)))
def test_the_shipped_configs_hold_only_what_differs_from_the_defaults(path: Path) -> None:
    raw = tomllib.loads(path.read_text())
    restated = [key for key, value in raw.items()
                if not isinstance(value, dict) and key != "name"
                and value == default_of(SiteConfig, key)]
    restated += [f"{section}.{key}" for section, table in raw.items() if isinstance(table, dict)
                 for key, value in table.items() if value == default_of(SECTIONS[section], key)]
    assert restated == []


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_the_configs_the_scenarios_write_load(tmp_path: Path, topology: str) -> None:
    write_sites(tmp_path, 3, topology=topology, peer_urls={"global": {"reg_a": "http://p:1"}})
    assert len(load_sites(tmp_path)) == 3


def test_the_example_in_the_site_settings_docs_loads(tmp_path: Path) -> None:
    """docs/operations.md shows every key, but [tuning]'s (a table of their own) and
    the inline login, which the docs steer away from."""
    docs = (PROJECT_ROOT / "docs" / "operations.md").read_text()
    example = docs[docs.index('```toml\nname = "reg_a"') + len("```toml\n"):]
    example = example[:example.index("```")]
    site = load_site(write_config(tmp_path, example))
    assert (site.name, site.daemon.lease, site.admin.port) == ("reg_a", 60.0, 7984)
    raw = tomllib.loads(example)
    shown = [key for key, value in raw.items() if not isinstance(value, dict)]
    shown += [f"{section}.{key}" for section, table in raw.items() if isinstance(table, dict)
              for key in table]
    assert sorted(shown) == sorted(setting for setting in EVERY_SETTING
                                   if not setting.startswith("tuning.")
                                   and setting not in ("couch.user", "couch.password"))


# Each setting with a value other than its default: loading it must change the config.
SAMPLES: dict[str, Any] = {
    "name": "other", "workers": 5, "peers": ["reg_b"],
    "couch.url": "http://127.0.0.1:6000", "couch.database": "other",
    "couch.credentials": "secrets/solo.toml", "couch.admin_credentials": "secrets/admin.toml",
    "couch.user": "someone", "couch.password": "secret",
    "replication.filtered": True, "replication.relay": True,
    "replication.peer_urls": {"reg_b": "http://gateway:1"},
    "commands.allow": ["true"], "commands.allow_shell": True,
    "daemon.shutdown_grace": 3.0, "daemon.lease": 90.0, "daemon.clock_skew_margin": 4.0,
    "daemon.journal": "/var/lib/jobdist/journal",
    "tuning.heartbeat": 20.0, "tuning.booking_timeout": 7.0, "tuning.start_write_delay": 0.5,
    "tuning.keepalive_period": 1.0, "tuning.keepalive_stale_after": 9.0,
    "retention.older_than": "30d", "retention.interval": 60.0,
    "retention.export": "/tmp/removed.jsonl",
    "admin.port": 7999, "admin.host": "0.0.0.0", "admin.token": "t0ken",
    "admin.token_file": "secrets/admin-token",
    "succession.successors": {"global": ["solo", "reg_b"]}, "succession.creator_timeout": 30.0,
}
EVERY_SETTING = [f"{section}.{key}" if section else key
                 for section, keys in SETTINGS.items() for key in keys]


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    return str(value)


def config_with(setting: str | None) -> str:
    """BASE, with `setting` set to its sample value."""
    tables: dict[str, dict[str, Any]] = {"": {"name": "solo"},
                                         "couch": {"url": "http://127.0.0.1:5999"}}
    if setting is not None:
        section, _, key = setting.rpartition(".")
        tables.setdefault(section, {})[key] = SAMPLES[setting]
    lines = [f"{key} = {toml_value(value)}" for key, value in tables.pop("").items()]
    for section, values in tables.items():
        lines += [f"[{section}]", *(f"{key} = {toml_value(v)}" for key, v in values.items())]
    return "\n".join(lines) + "\n"


def test_every_setting_has_a_sample() -> None:
    assert sorted(SAMPLES) == sorted(EVERY_SETTING)


@pytest.mark.parametrize("setting", EVERY_SETTING)
def test_every_listed_setting_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      setting: str) -> None:
    """The other half of "cannot drift": a key SETTINGS lists is not ignored."""
    for name in ("JOBDIST_COUCH_USER", "JOBDIST_COUCH_PASSWORD", "JOBDIST_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    default = load_site(write_config(tmp_path, config_with(None)))
    assert load_site(write_config(tmp_path, config_with(setting))) != default


def test_succession_is_off_by_default_and_read_in_order(tmp_path: Path) -> None:
    assert load_site(write_config(tmp_path, BASE)).succession.successors == {}
    site = load_site(write_config(tmp_path, BASE + '[succession]\ncreator_timeout = 8\n'
                                  'successors = { global = ["reg_b", "solo"] }\n'))
    assert site.succession == SuccessionSettings({"global": ("reg_b", "solo")}, 8.0)


@pytest.mark.parametrize(("succession", "message"), [
    ('successors = { global = ["global", "solo"] }', "a site appears twice in the line"),
    ('successors = { global = ["solo", "solo"] }', "a site appears twice in the line"),
    ('successors = { global = "solo" }', "succession.successors: global must be a list"),
    ('successors = { global = ["Solo!"] }', "must be a list of site names"),
    ("successors = 3", "succession.successors: must be a table"),
    ("creator_timeout = 3", "succession.creator_timeout (3.0) must be at least 4 s"),
])
def test_a_bad_succession_is_refused_with_the_reason(tmp_path: Path, succession: str,
                                                     message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_site(write_config(tmp_path, BASE + f"[succession]\n{succession}\n"))


def test_successors_must_be_sites_of_the_directory(tmp_path: Path) -> None:
    sites = write_sites(tmp_path / "sites", 2, successors={"global": ["reg_a", "reg_z"]})
    unknown = re.escape("succession.successors names unknown sites reg_z")
    with pytest.raises(ConfigError, match=unknown):
        load_sites(sites)


@pytest.mark.parametrize("doc", ["README.md", "docs/protocol.md"])
def test_the_documented_succession_table_loads(tmp_path: Path, doc: str) -> None:
    text = (PROJECT_ROOT / doc).read_text(encoding="utf-8")
    [table] = [block for block in re.findall(r"```toml\n(.*?)```", text, re.DOTALL)
               if "[succession]" in block]
    site = load_site(write_config(tmp_path, BASE + table))
    assert site.succession.successors == {"global": ("reg_a", "reg_b")}


@pytest.mark.parametrize("name", ["any", "all"])
def test_a_site_cannot_be_named_like_a_target_that_means_many(tmp_path: Path,
                                                                name: str) -> None:
    with pytest.raises(ValueError, match=f"name: '{name}' is a target that means"):
        load_site(write_config(tmp_path, BASE.replace('"solo"', f'"{name}"')))
