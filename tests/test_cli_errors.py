"""Errors people meet: one clear line on stderr, a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from jobdist.cli import COMMANDS, main
from jobdist.lab.localserver import free_port
from jobdist.validation import validate_submission

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def sites(tmp_path: Path) -> Path:
    """Two sites whose CouchDB nobody listens on."""
    directory = tmp_path / "sites"
    directory.mkdir()
    for name in ("global", "reg_a"):
        (directory / f"{name}.toml").write_text(
            f'name = "{name}"\n[couch]\nurl = "http://127.0.0.1:{free_port()}"\n')
    return directory


def run(*args: str, sites: Path | None = None, stdin: str | None = None) -> Result:
    env = {"JOBDIST_SITES": str(sites) if sites else None, "JOBDIST_SITE": None}
    result = CliRunner(env=env).invoke(main, list(args), input=stdin)
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit), repr(result.exception)
    return result


def one_line(result: Result, *fragments: str, code: int = 2) -> str:
    assert result.exit_code == code, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("jobdist: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def all_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and subcommand, the lazily loaded ones (cluster, bench, ...) included."""
    found = []
    context = click.Context(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        found.append((*prefix, name))
        if isinstance(command, click.Group):
            found += all_commands(command, (*prefix, name))
    return found


@pytest.mark.parametrize("command", all_commands(main), ids=" ".join)
def test_every_command_has_help(command: tuple[str, ...]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"Usage: main {' '.join(command)}")


def test_the_help_lists_each_command_with_its_own_summary() -> None:
    context = click.Context(main)
    for name, (_, summary) in COMMANDS.items():
        command = main.get_command(context, name)
        assert command is not None and command.get_short_help_str(10**6) == summary, name
    listed = CliRunner().invoke(main, ["--help"]).stdout
    assert [line.split()[0] for line in listed.split("Commands:\n")[1].splitlines()] \
        == sorted(COMMANDS)


# Loaded by the commands that need them, never by the command line's own start.
HEAVY_MODULES = ("rich", "jinja2", "prometheus_client", "ibmcloudant", "requests", "yaml",
                 "cronsim", "pyspark", "jobdist.couch", "jobdist.core", "jobdist.client",
                 "jobdist.render", "jobdist.lab", "jobdist.analytics")


def test_importing_the_cli_and_its_help_load_no_heavy_module() -> None:
    script = ("import json, sys; from jobdist.cli import main; print(json.dumps(list(sys.modules)))"
              "; main(['--help'], standalone_mode=False); print(json.dumps(list(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    assert done.returncode == 0, done.stderr
    after_import, after_help = (json.loads(line) for line in done.stdout.splitlines()
                                if line.startswith("["))
    for loaded in (after_import, after_help):
        heavy = [name for name in loaded
                 if any(name == module or name.startswith(f"{module}.")
                        for module in HEAVY_MODULES)]
        assert heavy == []


def test_version() -> None:
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    result = CliRunner().invoke(main, ["--version"])
    assert (result.exit_code, result.stdout) == (0, f"jobdist {project['version']}\n")


def test_stdin_is_read_without_deprecated_calls() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        result = CliRunner().invoke(main, ["validate", "-"], input='{"job": []}')
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stdout == "<stdin>: job: must be a non-empty list of steps\n"


# --- sites and configs ----------------------------------------------------------------


@pytest.mark.parametrize("args", [("show", "job-1"), ("list",), ("logs", "job-1"),
                                  ("cancel", "job-1"), ("cleanup", "--older-than", "1d"),
                                  ("submit", "--step", "true")])
def test_an_unknown_site(sites: Path, args: tuple[str, ...]) -> None:
    flag = "--at" if args[0] == "list" else "--site"
    one_line(run(*args, flag, "nowhere", sites=sites),
             "unknown site 'nowhere'; known: global, reg_a")


@pytest.mark.parametrize("option", ["--site", "--creator"])
def test_list_refuses_an_unknown_site_to_filter_on(sites: Path, option: str) -> None:
    """Not "no jobs match": a misspelt site is no site without jobs."""
    one_line(run("list", option, "reg_c", sites=sites),
             f"jobdist: {option}: unknown site 'reg_c'; known: global, reg_a")


def test_a_missing_sites_directory(tmp_path: Path) -> None:
    line = one_line(run("list", "--sites", str(tmp_path / "nope")), "no such sites directory")
    assert "--sites DIR" in line
    one_line(run("watch", "--once", "--sites", str(tmp_path / "nope")), "no such sites directory")
    one_line(run("setup", "--sites", str(tmp_path / "nope")), "no such sites directory")


def test_an_empty_sites_directory(tmp_path: Path) -> None:
    one_line(run("show", "job-1", "--sites", str(tmp_path)), "no site configs (*.toml) found")


def test_a_broken_site_config(sites: Path) -> None:
    (sites / "reg_b.toml").write_text('name = "reg_b"\n[couch\n')
    one_line(run("list", sites=sites), "reg_b.toml: cannot read site config")
    (sites / "reg_b.toml").write_text('name = "reg_b"\n')
    one_line(run("list", sites=sites), "reg_b.toml: missing setting 'couch.url'")
    (sites / "reg_b.toml").write_text('name = "reg_b"\n[couch]\nurl = "http://x:1"\n'
                                      '[deamon]\nlease = 5.0\n')
    one_line(run("list", sites=sites),
             "reg_b.toml: unknown setting 'deamon' (did you mean 'daemon'?)")


def test_a_missing_daemon_config(tmp_path: Path) -> None:
    one_line(run("site", "run", "--config", str(tmp_path / "nope.toml")), "no such site config")


def test_several_sites_and_none_chosen(sites: Path) -> None:
    (sites / "global.toml").rename(sites / "other.toml")
    (sites / "other.toml").write_text(
        (sites / "other.toml").read_text().replace('"global"', '"other"'))
    one_line(run("list", sites=sites), "which site? give --site, one of: other, reg_a")


# --- an unreachable CouchDB -----------------------------------------------------------------


@pytest.mark.parametrize("args", [("show", "job-1"), ("list",), ("logs", "job-1"),
                                  ("cancel", "job-1"), ("cleanup", "--older-than", "1d"),
                                  ("submit", "--step", "true"), ("show", "job-1", "--json")])
def test_an_unreachable_couchdb(sites: Path, args: tuple[str, ...]) -> None:
    one_line(run(*args, sites=sites), "cannot reach the CouchDB of site global at "
             "http://127.0.0.1:", "connection refused", "jobdist cluster status")


def test_setup_and_watch_report_each_unreachable_site(sites: Path) -> None:
    result = run("setup", sites=sites)
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 2
    assert all("connection refused" in line for line in lines)
    watched = run("watch", "--once", sites=sites)
    assert watched.exit_code == 1  # a check in a script must see that sites are down
    assert watched.stdout.count("unreachable") == 2
    assert watched.stdout.count("connection refused") == 2


# --- bad job files and flags ------------------------------------------------------------------


@pytest.mark.parametrize(("name", "content", "message"), [
    ("job.json", '{"job": [', "job.json: not valid JSON: Expecting value: line 1 column 10"),
    ("job.json", '{"priority": NaN}', "job.json: not valid JSON: NaN is not a JSON value"),
    ("job.yaml", "job: [\n", "job.yaml: not valid YAML: line 2, column 1: expected the node "
     "content, but found '<stream end>' (while parsing a flow node)"),
    ("job.yaml", "job: !!set {a}\n", "job.yaml: not a JSON value in YAML: job: a set"),
    ("job.yml", "job:\n  - do: .nan\n", "job.yml: not a JSON value in YAML: job[0].do: nan is"),
    ("job.yaml", "1: x\n",
     "job.yaml: not a JSON value in YAML: the document: key 1 is not a string"),
    ("job.json", b"\xff\xfe", "job.json: not valid JSON: not UTF-8 text"),
    ("job.txt", None, "job.txt: cannot read: No such file or directory"),
])
def test_an_unreadable_job_file(sites: Path, tmp_path: Path, name: str,
                                content: str | bytes | None, message: str) -> None:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    one_line(run("submit", str(path), sites=sites), f"{tmp_path}/{message}")


def test_an_invalid_job_prints_one_line_per_error(sites: Path, tmp_path: Path) -> None:
    bad = {"priority": "high", "job": [{"target": [], "do": "", "cmd": "ls"}]}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(bad))
    result = run("submit", str(path), sites=sites)
    assert result.exit_code == 2
    expected = validate_submission(bad)
    assert len(expected) >= 3
    assert result.stderr.splitlines() == [f"jobdist: {error}" for error in expected]


def test_an_unknown_top_level_field_is_refused_and_meta_is_kept(sites: Path) -> None:
    job = "priorty: 5\njob:\n  - {do: make, target: any}\n"
    one_line(run("submit", "-", sites=sites, stdin=job),
             "jobdist: priorty: unknown field (did you mean 'priority'?)")
    job = "priority: 5\nmeta: {ticket: OPS-1, tags: [nightly]}\njob:\n  - {do: make, target: any}\n"
    result = run("submit", "-", "--dry-run", sites=sites, stdin=job)
    assert result.exit_code == 0, result.output
    submitted = json.loads(result.stdout)
    assert submitted["priority"] == 5
    assert submitted["meta"] == {"ticket": "OPS-1", "tags": ["nightly"]}


def test_stdin_yaml_and_unknown_targets(sites: Path) -> None:
    result = run("submit", "-", sites=sites,
                 stdin="job:\n  - do: make\n    target: [reg_a, reg_z]\n  - do: ls\n"
                       "    target: mars\n")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "jobdist: job[0].target: unknown site 'reg_z'; known: global, reg_a",
        "jobdist: job[1].target: unknown site 'mars'; known: global, reg_a",
    ]


@pytest.mark.parametrize(("args", "message"), [
    ((), "nothing to submit"),
    (("job.json", "--step", "true"), "give a job FILE or --step options, not both"),
    (("--step", "a", "--step", "b", "--target", "reg_a"),
     "--target is given 1 times for 2 steps: give it once per --step"),
    (("--step", "a", "--retries", "1", "--retries", "2", "--retries", "3"),
     "--retries is given 3 times for 1 steps"),
    (("--step", "a", "--target", ","), "--target ',': name a site"),
    (("--step", "a", "--target", "nowhere"), "job[0].target: unknown site 'nowhere'"),
    (("--step", "", "--wait"), "job[0].do: must be a non-empty string"),
])
def test_bad_submit_flags(sites: Path, args: tuple[str, ...], message: str) -> None:
    one_line(run("submit", *args, sites=sites), message)


def test_a_dry_run_needs_no_server(sites: Path) -> None:
    result = run("submit", "--dry-run", "--step", "make", "--step", "make test",
                 "--target", "reg_a,global", "--target", "any", "--retries", "2",
                 "--alt", "true", "--timeout", "9.5", sites=sites)
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)
    assert [step["target"] for step in job["job"]] == [["reg_a", "global"], "any"]
    assert all(step["retry_strategy"]["max_retries"] == 2 and step["alt_do"] == "true"
               and step["timeout"] == 9.5 for step in job["job"])


def test_validate_reads_yaml_too(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("job:\n  - do: make\n    target: any\n")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert (result.exit_code, result.stdout) == (0, f"{path}: ok\n")


@pytest.mark.parametrize(("args", "message"), [
    (("cleanup", "--older-than", "soon"), "'soon' is not a duration"),
    (("list", "--before", "yesterday"), "--before 'yesterday': give an ISO 8601 time"),
    (("logs", "job-1", "--step", "x"), None),
])
def test_bad_options(sites: Path, args: tuple[str, ...], message: str | None) -> None:
    result = run(*args, sites=sites)
    assert result.exit_code == 2
    if message is not None:
        one_line(result, message)


# --- as a real process ------------------------------------------------------------------------


def test_as_a_process_no_traceback(sites: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("job: [\n")
    for args in (["list", "--sites", str(tmp_path / "nope")],
                 ["show", "job-1", "--sites", str(sites)],
                 ["submit", str(bad), "--sites", str(sites)],
                 ["show", "job-1", "--sites", str(sites), "--site", "mars"]):
        done = subprocess.run([sys.executable, "-m", "jobdist", *args], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr + done.stdout
        assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith("jobdist: ")


def test_a_long_summary_is_cut_at_a_word_within_the_width() -> None:
    listed = CliRunner().invoke(main, ["--help"], terminal_width=60).stdout
    commands = listed.split("Commands:\n")[1].splitlines()
    summaries = dict(line.split(maxsplit=1) for line in commands)
    assert summaries["cancel"] == "Cancel a job."
    assert summaries["secrets"] == "Write the credentials and admin token..."
    assert all(len(line) <= 60 for line in listed.splitlines())
