"""The design documents, kept as files under couch_design/ and built into JSON.

couch_design/<name>/ is the design document `_design/<name>`:
  validate_doc_update.js
  views/<view>/map.js  (+ views/<view>/reduce.js: JavaScript or a builtin like `_count`)
  filters/<filter>.js
Each function file holds one ES5 function expression starting with `function`:
CouchDB and pouchdb-server evaluate the text as an expression.

The top-level couch_design/ is the one source: pyproject.toml installs it as the
package data `jobdist.couch_design`, so a wheel carries it too.

Two design documents, because a server indexes all the views of a design
document together, on the first query after a change: `jobdist` holds the
validator, the replication filters and the views the daemons query on a timer;
`jobdist_people` the views only people query (`jobdist list`, `watch`, the
dashboard, reports), so that the daemons' queries never index those.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

# Our design documents' names (couch_design/<name>/), the one place each is written:
# the daemons' (validator, filters, the views they query on a timer) and people's.
DDOC = "jobdist"
PEOPLE_DDOC = "jobdist_people"

# The design documents' version, written in each as VERSION_FIELD: raised with
# every change under couch_design/ (tests/test_design.py holds the files' digest
# for it), so that `jobdist setup` of an older release never overwrites the design
# documents of a newer one during a rolling upgrade (docs/operations.md).
DESIGN_VERSION = 3
VERSION_FIELD = "jobdist_design_version"

# In a checkout, couch_design/ beside the package. Read first: setuptools' editable
# install cannot import a mapped folder without __init__.py as jobdist.couch_design, and a
# checkout run without installing it (a worktree's tests) must not get another one's.
CHECKOUT_DESIGN_DIR = Path(__file__).resolve().parent.parent / "couch_design"


def design_dir() -> Traversable:
    """The design documents' directory: the checkout's, else the installed package data."""
    if CHECKOUT_DESIGN_DIR.is_dir():
        return CHECKOUT_DESIGN_DIR
    return resources.files("jobdist.couch_design")


def load_design_docs(root: Traversable | None = None) -> list[dict[str, Any]]:
    """One design document per directory under `root` (default: ours), in name order."""
    return [build_design_doc(folder) for folder in entries(root or design_dir())
            if folder.is_dir()]


def design_version(doc: dict[str, Any] | None) -> int:
    """The version a stored design document says it is (0: written before versions)."""
    version = (doc or {}).get(VERSION_FIELD)
    return version if isinstance(version, int) and not isinstance(version, bool) else 0


def build_design_doc(folder: Traversable) -> dict[str, Any]:
    doc: dict[str, Any] = {"_id": f"_design/{folder.name}", "language": "javascript",
                           VERSION_FIELD: DESIGN_VERSION}
    validator = folder / "validate_doc_update.js"
    if validator.is_file():
        doc["validate_doc_update"] = read_source(validator)
    views = {view.name: scripts(view) for view in entries(folder / "views") if view.is_dir()}
    for key, functions in (("views", views), ("filters", scripts(folder / "filters"))):
        if functions:
            doc[key] = functions
    if folder.name == PEOPLE_DDOC:
        # Apache CouchDB 3 keeps every design document's indexes warm after writes (its
        # background indexer) unless told not to: people's views are built when queried.
        doc["autoupdate"] = False
    return doc


def scripts(folder: Traversable) -> dict[str, str]:
    """The functions of a folder's `.js` files, by name: a view's `map` and `reduce`,
    or the filters."""
    return {path.name.removesuffix(".js"): read_source(path) for path in entries(folder)
            if path.name.endswith(".js")}


def entries(folder: Traversable) -> list[Traversable]:
    """What a folder holds, in name order; nothing when it is not there."""
    return sorted(folder.iterdir(), key=lambda path: path.name) if folder.is_dir() else []


def read_source(path: Traversable) -> str:
    # Trailing whitespace stripped: the same files always build the same document.
    return path.read_text(encoding="utf-8").rstrip()
