"""The architecture's boundaries, checked: the product never imports the lab (local
clusters, scenarios, benchmarks, the demo); no product module outgrows what one reads
in a sitting; the decision core's safety path imports no scheduling policy."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "jobdist"
MAX_MODULE_LINES = 600


# The decision core's layers (jobdist/core/__init__.py): a module imports only from its
# own layer or those before it; the safety path comes first and sees no policy.
CORE_LAYERS = (
    ("types", "leaves", "edits", "fencing", "revision", "succession"),
    ("placement", "wait", "starts", "broadcast"),
    ("finish", "decide", "plans"),
)


def product_modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if "lab" not in path.parts)


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, absolute (relative imports resolved from its package)."""
    tree = ast.parse(path.read_text(), str(path))
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else ()
            module = ".".join((*base, *([node.module] if node.module else [])))
            names.add(module)
            names |= {f"{module}.{alias.name}" for alias in node.names}
    return names


def test_imports_resolve_relative_to_their_package() -> None:
    assert "jobdist.model" in imported_modules(PACKAGE / "core" / "leaves.py")
    assert "jobdist.core.types" in imported_modules(PACKAGE / "core" / "leaves.py")
    assert "jobdist.core" in imported_modules(PACKAGE / "manager.py")


def test_no_module_passes_the_line_limit() -> None:
    # The lab's modules too: one reads them to run or change a benchmark.
    lengths = {str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
               for path in PACKAGE.rglob("*.py")}
    assert {name: lines for name, lines in lengths.items() if lines > MAX_MODULE_LINES} == {}


def test_each_core_module_imports_only_its_own_layer_or_those_before() -> None:
    core = PACKAGE / "core"
    layer_of = {name: index for index, layer in enumerate(CORE_LAYERS) for name in layer}
    assert set(layer_of) == {path.stem for path in core.glob("*.py")} - {"__init__"}
    offenders = {}
    for name, layer in layer_of.items():
        siblings = {module.split(".")[2] for module in imported_modules(core / f"{name}.py")
                    if module.startswith("jobdist.core.")}
        later = sorted(sibling for sibling in siblings if layer_of.get(sibling, 0) > layer)
        if later:
            offenders[name] = later
    assert offenders == {}


def test_no_product_module_imports_the_lab() -> None:
    product = product_modules()
    assert len(product) > 10
    offenders = {str(path.relative_to(PACKAGE)): sorted(name for name in imported_modules(path)
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
