"""Logs: one line an event, `EVENT key=value ...`, with the site always in it.

    … INFO jobdist.manager start job=job-20261123T0510… step=0 epoch=2 site=reg_a rev=3-…

`EventLog` is a `logging.LoggerAdapter` that carries a context (the site; a
worker's job, step and worker) and turns keyword arguments into fields:

    log = EventLog("jobdist.manager", site="reg_a")
    log.info("write failed", job=doc_id, step=2, error=error)

Fields come in a fixed order (job, step, epoch, site, worker, then the rest as
given), so lines about one step read alike whichever module wrote them; a
value with spaces, quotes, `=` or a character that does not print (a newline, an
escape) is quoted, so a line stays one line and splits back into fields.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

FIRST_FIELDS = ("job", "step", "epoch", "site", "worker")
_LOGGING_KEYWORDS = {"exc_info", "stack_info", "stacklevel", "extra"}


class EventLog(logging.LoggerAdapter[logging.Logger]):
    def __init__(self, name: str, **context: object) -> None:
        super().__init__(logging.getLogger(name), context)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]
                ) -> tuple[Any, MutableMapping[str, Any]]:
        fields = {key: kwargs.pop(key) for key in list(kwargs) if key not in _LOGGING_KEYWORDS}
        text = format_fields({**(self.extra or {}), **fields})
        return (f"{msg} {text}" if text else msg), kwargs


def format_fields(fields: Mapping[str, object]) -> str:
    ordered = [key for key in FIRST_FIELDS if key in fields]
    ordered += [key for key in fields if key not in FIRST_FIELDS]
    return " ".join(f"{key}={format_value(fields[key])}" for key in ordered
                    if fields[key] is not None)


def format_value(value: object) -> str:
    if isinstance(value, float):
        return str(round(value, 3))
    text = str(value)
    if not text or not text.isprintable() or any(c.isspace() or c in "\"'=" for c in text):
        return repr(text)
    return text


def configure_logging(level: str = "INFO", path: Path | None = None) -> None:
    """One line an event: time, level, component, then the event and its fields.

    `level` is jobdist's; the libraries under it say only their warnings (at DEBUG
    the CouchDB SDK would dump each HTTP exchange, headers and bodies, over many lines).
    """
    handler: logging.Handler = (
        logging.FileHandler(path) if path is not None else logging.StreamHandler()
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    ours = logging.getLogger("jobdist")
    ours.setLevel(level)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(ours.level, logging.WARNING))
