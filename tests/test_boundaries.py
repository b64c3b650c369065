"""The product never imports the lab (local clusters, scenarios, benchmarks, the demo)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "jobdist"


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, absolute (relative imports resolved from `jobdist`)."""
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = "jobdist" if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            names.add(module)
            names |= {f"{module}.{alias.name}" for alias in node.names}
    return names


def test_no_product_module_imports_the_lab() -> None:
    product = [*PACKAGE.glob("*.py"), *PACKAGE.glob("cli/*.py")]
    assert len(product) > 10
    offenders = {path.name: sorted(name for name in imported_modules(path)
                                   if name.startswith("jobdist.lab"))
                 for path in product}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_daemon_and_the_operator_commands_load_no_lab_module() -> None:
    # `jobdist site run` is the container's entry point: it loads the CLI and the daemon.
    code = ("import sys, jobdist.cli, jobdist.daemon; "
            "print(sorted(m for m in sys.modules if m.startswith('jobdist.lab')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "[]"


def test_the_lab_commands_are_still_there() -> None:
    from click.testing import CliRunner

    from jobdist.cli import main

    listing = CliRunner().invoke(main, ["--help"]).output
    for command in ("cluster", "demo", "bench", "report", "site", "submit"):
        assert f"  {command}" in listing, listing
    assert CliRunner().invoke(main, ["cluster", "--help"]).exit_code == 0
