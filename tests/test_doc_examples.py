"""Every job example in README.md and docs/ is a job `jobdist validate` accepts."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobdist.validation import validate_job, validate_submission

from .helpers import readme_http_submission

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"```(yaml|json)\n(.*?)```", re.DOTALL)


def job_examples() -> list[Any]:
    """(where, document) for each YAML or JSON block that holds a job (a `job` list)."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for match in BLOCK.finditer(text):
            kind, body = match.groups()
            doc = json.loads(body) if kind == "json" else yaml.safe_load(body)
            if isinstance(doc, dict) and isinstance(doc.get("job"), list):
                line = text.count("\n", 0, match.start()) + 1
                found.append(pytest.param(doc, id=f"{path.name}:{line}"))
    return found


EXAMPLES = job_examples()


def test_the_docs_hold_job_examples() -> None:
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("doc", EXAMPLES)
def test_a_job_example_validates(doc: dict[str, Any]) -> None:
    assert validate_submission(doc) == []


def test_the_readme_curl_submission_is_a_job_the_rules_accept_as_it_stands() -> None:
    """Written straight into CouchDB, with no `jobdist submit` to fill anything in."""
    _, doc = readme_http_submission()
    assert validate_job(doc) == []
    assert doc == {"type": "job", "creator": "global",
                   "job": [{"target": "any", "do": doc["job"][0]["do"]}]}
