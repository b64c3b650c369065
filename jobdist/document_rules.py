"""The rules of the documents beside jobs: site status documents and schedules.

couch_design/jobdist/validate_doc_update.js holds the same rules, with the same
messages; they are built from the job document's (jobdist/validation.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .checks import (
    Check,
    Field,
    Shape,
    describe_choices,
    is_object,
    is_string,
    one_of,
    simple,
    unchecked,
)
from .validation import COUCHDB_FIELDS, COUNT, FLAG, NAME, SERVER_FILLED, SITE, TIME, validate_job


def validate_site_status(doc: Any) -> list[str]:
    """A site's status document (jobdist/status.py); the same rules as validate_doc_update."""
    return validate_object(doc, lambda: site_status_fields(doc.get("site")), {})


def validate_object(doc: Any, fields: Callable[[], list[Field]],
                    defaults: dict[str, Any]) -> list[str]:
    """Every rule a document of a closed set of `fields` breaks."""
    if not is_object(doc):
        return ["document: must be a JSON object"]
    errors: list[str] = []
    Shape(fields(), defaults).check(doc, "", errors)
    return errors


def id_of(prefix: str, name: Any, what: str) -> Check:
    """`_id` of a document named by one of its fields: `<prefix><name>`."""
    return simple(lambda value: is_string(name) and value == prefix + name,
                  f"must be \"{prefix}\" followed by the {what}'s name")


def site_status_fields(site: Any) -> list[Field]:
    return [
        Field("_id", id_of("site-", site, "site")),
        Field("type", unchecked),
        Field("site", SITE),
        Field("workers", COUNT),
        Field("free_workers", COUNT),
        Field("draining", FLAG),
        Field("assigns", FLAG),
        Field("restricted", FLAG),
        Field("updated_at", TIME),
        *(Field(name, unchecked, optional=True) for name in COUCHDB_FIELDS),
    ]


# --- schedules (jobdist/schedules.py) ------------------------------------------------

CRON = re.compile(r"[0-9A-Za-z*?,/#-]+( [0-9A-Za-z*?,/#-]+){4}")
CRON_REASON = ("must be a cron expression of 5 fields (minute hour day month weekday), "
               "e.g. \"0 2 * * *\"")
TIMEZONE = re.compile(r"[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+){0,2}")
TIMEZONE_REASON = 'must be an IANA time zone name, e.g. "UTC" or "Europe/Zurich"'
MISSED_POLICIES = ("latest", "all", "skip")
SCHEDULE_DEFAULTS: dict[str, Any] = {"enabled": True, "missed": "latest", "timezone": "UTC"}


def validate_schedule(doc: Any) -> list[str]:
    """A schedule document; the same rules as validate_doc_update."""
    return validate_object(doc, lambda: schedule_fields(doc.get("name")), SCHEDULE_DEFAULTS)


def schedule_fields(name: Any) -> list[Field]:
    return [
        Field("_id", id_of("schedule-", name, "schedule")),
        Field("type", unchecked),
        Field("name", NAME),
        Field("cron", simple(lambda value: is_string(value) and len(value) <= 200
                             and CRON.fullmatch(value) is not None, CRON_REASON)),
        Field("timezone", simple(lambda value: is_string(value) and len(value) <= 64
                                 and TIMEZONE.fullmatch(value) is not None, TIMEZONE_REASON)),
        Field("owner", SITE),
        Field("enabled", FLAG),
        Field("missed", simple(one_of(MISSED_POLICIES), describe_choices(MISSED_POLICIES))),
        Field("job", check_template),
        Field("created_at", TIME),
        Field("updated_at", TIME),
        *(Field(name, unchecked, optional=True) for name in COUCHDB_FIELDS),
    ]


def check_template(value: Any, path: str, errors: list[str]) -> None:
    """The job each tick submits: a submission, with its errors under `job.`."""
    if not is_object(value):
        errors.append(f"{path}: must be an object: the job each tick submits")
        return
    errors.extend(f"{path}.{error}" for error in validate_job({**SERVER_FILLED, **value}))
