"""Site configuration: one TOML file per site (sites/NAME.toml).

    name = "reg_a"
    workers = 2
    peers = ["global", "reg_b"]        # sites this one replicates with

    [replication]
    filtered = false                   # push to peers only the jobs that concern them
    relay = false                      # a hub: peers push everything here to pass on

    [couch]
    url = "http://127.0.0.1:5985"      # credentials: user/password keys, the URL,
    database = "jobs"                  # or $JOBDIST_COUCH_USER / $JOBDIST_COUCH_PASSWORD

    [keepalive]
    period = 5.0                       # seconds between keep-alive passes
    stale_after = 30.0                 # re-save open jobs unchanged for this long

    [daemon]
    booking_timeout = 60.0             # give up a claim the creator has not decided
    shutdown_grace = 10.0              # running steps get this long on SIGTERM
    lease = 60.0                       # a winner's promise lasts this long unless renewed
    heartbeat = 15.0                   # how often a site renews the leases of its steps
    clock_skew_margin = 10.0           # the creator waits this much past a lease

    [retention]                        # optional: the daemon removes its own old jobs
    older_than = "30d"                 # finished jobs last updated longer ago (90m, 12h, 30d)
    interval = 3600.0                  # seconds between passes
    export = "/var/lib/jobdist/removed.jsonl"   # append each job here before removing it

    [admin]
    port = 7984                        # the daemon's HTTP endpoint; none when unset
    host = "127.0.0.1"
    token = "..."                      # or $JOBDIST_ADMIN_TOKEN; required for every POST
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

SITE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


class ConfigError(ValueError):
    """A site configuration that cannot be used; the message says why and where."""


@dataclass(frozen=True)
class SiteConfig:
    name: str
    couch_url: str
    database: str = "jobs"
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    workers: int = 2
    peers: tuple[str, ...] = ()
    filtered: bool = False
    relay: bool = False
    keepalive_period: float = 5.0
    keepalive_stale_after: float = 30.0
    booking_timeout: float = 60.0
    shutdown_grace: float = 10.0
    lease: float = 60.0
    heartbeat: float = 15.0
    clock_skew_margin: float = 10.0
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


def load_site(path: Path | str) -> SiteConfig:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such site config") from None
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path}: cannot read site config: {error}") from None
    try:
        return _site_from(raw, path)
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
    return sites


def _site_from(raw: dict[str, Any], path: Path) -> SiteConfig:
    name = raw["name"]
    if not isinstance(name, str) or not SITE_NAME.match(name):
        raise ValueError(f"name {name!r} must be 1-64 of a-z, 0-9, _ and -")
    couch = raw.get("couch", {})
    keepalive = raw.get("keepalive", {})
    daemon = raw.get("daemon", {})
    admin = raw.get("admin", {})
    replication = raw.get("replication", {})
    retention = raw.get("retention", {})
    if "older_than" in retention:
        from .retention import RetentionError, parse_duration

        try:
            parse_duration(str(retention["older_than"]))
        except RetentionError as error:
            raise ValueError(f"retention.older_than: {error}") from None
    workers = int(raw.get("workers", 2))
    if workers < 0:
        raise ValueError("workers must be >= 0")
    _check_lease(raw.get("daemon", {}))
    return SiteConfig(
        name=name,
        couch_url=str(couch["url"]),
        database=str(couch.get("database", "jobs")),
        user=couch.get("user") or os.environ.get("JOBDIST_COUCH_USER"),
        password=couch.get("password") or os.environ.get("JOBDIST_COUCH_PASSWORD"),
        workers=workers,
        peers=tuple(raw.get("peers", ())),
        filtered=bool(replication.get("filtered", False)),
        relay=bool(replication.get("relay", False)),
        keepalive_period=float(keepalive.get("period", 5.0)),
        keepalive_stale_after=float(keepalive.get("stale_after", 30.0)),
        booking_timeout=float(daemon.get("booking_timeout", 60.0)),
        shutdown_grace=float(daemon.get("shutdown_grace", 10.0)),
        lease=float(daemon.get("lease", 60.0)),
        heartbeat=float(daemon.get("heartbeat", 15.0)),
        clock_skew_margin=float(daemon.get("clock_skew_margin", 10.0)),
        retention_older_than=(str(retention["older_than"]) if "older_than" in retention
                              else None),
        retention_interval=float(retention.get("interval", 3600.0)),
        retention_export=Path(retention["export"]) if "export" in retention else None,
        admin_host=str(admin.get("host", "127.0.0.1")),
        admin_port=int(admin["port"]) if "port" in admin else None,
        admin_token=admin.get("token") or os.environ.get("JOBDIST_ADMIN_TOKEN"),
        path=path,
    )


def _check_lease(daemon: dict[str, Any]) -> None:
    lease, heartbeat = float(daemon.get("lease", 60.0)), float(daemon.get("heartbeat", 15.0))
    if not 0 < heartbeat <= lease / 2:
        raise ValueError(f"daemon.heartbeat ({heartbeat}) must be above 0 and at most half "
                         f"of daemon.lease ({lease}), so one lost heartbeat is not fatal")


def _describe(error: Exception) -> str:
    if isinstance(error, KeyError):
        return f"missing setting {error.args[0]!r}"
    return str(error)
