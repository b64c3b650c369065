"""The Quick start's commands as CI runs them: `.ci/run` runs the README's command 2
as written, and what it installs it installs quietly."""

from __future__ import annotations

import json
import re

from .helpers import README

CI_RUN = README.parent / ".ci" / "run"


def quick_start_command(number: int) -> str:
    """The line under `# N. ...` in the README's Quick start block."""
    match = re.search(rf"^# {number}\. .*\n(.+)$", README.read_text(), re.MULTILINE)
    assert match, f"no command {number} in the README's Quick start"
    return match.group(1)


def test_ci_runs_the_readmes_test_command_as_written() -> None:
    assert quick_start_command(2) in CI_RUN.read_text().splitlines()


def test_chromium_is_installed_without_recommends_and_its_output_in_a_log() -> None:
    command = quick_start_command(2)
    install = re.search(r"apt-get install ([^)]*)\)", command)
    assert install and install.group(1).split() == ["-y", "-qq", "--no-install-recommends",
                                                    "chromium"], command
    # apt's ~hundreds of lines go to the log; the terminal gets one line, or the log's tail.
    assert ") >/tmp/chromium-install.log 2>&1 || (tail -n 20 /tmp/chromium-install.log" \
        in command


def test_every_install_script_npm_runs_is_allowed_by_name() -> None:
    """npm 11.16+ warns of, and later npm versions skip, the install scripts of packages
    `allowScripts` does not name: leveldown and sqlite3 would be left without their
    native bindings. Name-only entries: the lockfile has no `resolved` URLs to pin by."""
    lock = json.loads((README.parent / "package-lock.json").read_text())
    scripted = {path.rsplit("node_modules/", 1)[1] for path, package in lock["packages"].items()
                if path and package.get("hasInstallScript")}
    allowed = json.loads((README.parent / "package.json").read_text()).get("allowScripts", {})
    assert scripted == {"leveldown", "sqlite3"}
    assert allowed == dict.fromkeys(scripted, True)
