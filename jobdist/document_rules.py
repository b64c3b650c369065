"""The rules of the documents beside jobs: site status documents and schedules.

couch_design/jobdist/validate_doc_update.js holds the same rules, with the same
messages; they are built from the job document's (jobdist/validation.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .checks import Check, Field, Shape, choice, is_object, is_string, must_be, unchecked
from .validation import (
    COUCHDB_FIELDS,
    COUNT,
    FLAG,
    JOB_FIELDS,
    NAME,
    SITE,
    TIME,
    validate_submission,
)


def validate_site_status(doc: Any) -> list[str]:
    """A site's status document (jobdist/status.py); the same rules as validate_doc_update."""
    return validate_object(doc, site_status_fields, {})


def validate_object(doc: Any, fields: Callable[[dict[str, Any]], list[Field]],
                    defaults: dict[str, Any]) -> list[str]:
    """Every rule a document of a closed set of `fields` (given the document) breaks."""
    if not is_object(doc):
        return ["document: must be a JSON object"]
    errors: list[str] = []
    Shape(fields(doc), defaults).check(doc, "", errors)
    return errors


def id_of(prefix: str, name: Any, what: str) -> Check:
    """`_id` of a document named by one of its fields: `<prefix><name>`."""
    return must_be(lambda value: is_string(name) and value == prefix + name,
                   f"\"{prefix}\" followed by the {what}'s name")


def site_status_fields(doc: dict[str, Any]) -> list[Field]:
    return [
        Field("_id", id_of("site-", doc.get("site"), "site")),
        Field("type", unchecked),
        Field("site", SITE),
        Field("workers", COUNT),
        Field("free_workers", COUNT),
        Field("draining", FLAG),
        Field("assigns", FLAG),
        Field("restricted", FLAG),
        Field("updated_at", TIME),
        *COUCHDB_FIELDS,
    ]


# --- schedules (jobdist/schedules.py) ------------------------------------------------

CRON = re.compile(r"[0-9A-Za-z*?,/#-]+( [0-9A-Za-z*?,/#-]+){4}")
TIMEZONE = re.compile(r"[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+){0,2}")
MISSED_POLICIES = ("latest", "all", "skip")
SCHEDULE_DEFAULTS: dict[str, Any] = {"enabled": True, "missed": "latest", "timezone": "UTC"}


def validate_schedule(doc: Any) -> list[str]:
    """A schedule document; the same rules as validate_doc_update."""
    return validate_object(doc, schedule_fields, SCHEDULE_DEFAULTS)


def matches(pattern: re.Pattern[str], max_length: int) -> Callable[[Any], bool]:
    return lambda value: (is_string(value) and len(value) <= max_length
                          and pattern.fullmatch(value) is not None)


def schedule_fields(doc: dict[str, Any]) -> list[Field]:
    return [
        Field("_id", id_of("schedule-", doc.get("name"), "schedule")),
        Field("type", unchecked),
        Field("name", NAME),
        Field("cron", must_be(matches(CRON, 200), "a cron expression of 5 fields "
                              "(minute hour day month weekday), e.g. \"0 2 * * *\"")),
        Field("timezone", must_be(matches(TIMEZONE, 64),
                                  'an IANA time zone name, e.g. "UTC" or "Europe/Zurich"')),
        Field("owner", SITE),
        Field("enabled", FLAG),
        Field("missed", choice(MISSED_POLICIES)),
        Field("job", check_template),
        Field("created_at", TIME),
        Field("updated_at", TIME),
        *COUCHDB_FIELDS,
    ]


def check_template(value: Any, path: str, errors: list[str]) -> None:
    """The job each tick submits: a submission, with its errors under `job.`."""
    if not is_object(value):
        errors.append(f"{path}: must be an object: the job each tick submits")
        return
    errors.extend(f"{path}.{error}" for error in validate_submission(value))
    errors.extend(f"{path}.{field.name}: {NOT_COPIED}" for field in JOB_FIELDS
                  if field.name not in TEMPLATE_FIELDS and field.name in value)


# What a tick's job takes of the template (schedules.tick_job): a field beyond these
# would be dropped without a word, so it is refused.
TEMPLATE_FIELDS = ("type", "job", "priority", "meta")
NOT_COPIED = "not copied to the jobs of the ticks: a schedule's job takes job, priority and meta"
