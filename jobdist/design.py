"""The design documents, kept as files under couch_design/ and built into JSON.

couch_design/<name>/ is the design document `_design/<name>`:
  validate_doc_update.js
  views/<view>/map.js  (+ views/<view>/reduce.js: JavaScript or a builtin like `_count`)
  filters/<filter>.js
Each function file holds one ES5 function expression starting with `function`:
CouchDB and pouchdb-server evaluate the text as an expression.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DESIGN_DIR = Path(__file__).resolve().parent.parent / "couch_design"


def load_design_docs(root: Path = DESIGN_DIR) -> list[dict[str, Any]]:
    """One design document per directory under `root`, in name order."""
    return [build_design_doc(folder) for folder in sorted(root.iterdir()) if folder.is_dir()]


def build_design_doc(folder: Path) -> dict[str, Any]:
    doc: dict[str, Any] = {"_id": f"_design/{folder.name}", "language": "javascript"}
    validator = folder / "validate_doc_update.js"
    if validator.is_file():
        doc["validate_doc_update"] = read_source(validator)
    views = load_views(folder / "views")
    if views:
        doc["views"] = views
    filters = load_filters(folder / "filters")
    if filters:
        doc["filters"] = filters
    return doc


def load_views(folder: Path) -> dict[str, dict[str, str]]:
    views: dict[str, dict[str, str]] = {}
    for view in sorted(subdirectories(folder)):
        views[view.name] = {"map": read_source(view / "map.js")}
        reduce = view / "reduce.js"
        if reduce.is_file():
            views[view.name]["reduce"] = read_source(reduce)
    return views


def load_filters(folder: Path) -> dict[str, str]:
    if not folder.is_dir():
        return {}
    return {path.stem: read_source(path) for path in sorted(folder.glob("*.js"))}


def subdirectories(folder: Path) -> list[Path]:
    return [path for path in folder.iterdir() if path.is_dir()] if folder.is_dir() else []


def read_source(path: Path) -> str:
    # Trailing whitespace stripped: the same files always build the same document.
    return path.read_text(encoding="utf-8").rstrip()
