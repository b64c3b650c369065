"""The demo's table, rendered from fixed results (running the demo takes minutes):
it fits 80 columns, names every scenario whole, and compares with the thesis at the
thesis's step length."""

from __future__ import annotations

import collections
import io
import re

import pytest
from rich.cells import cell_len
from rich.console import Console

from jobdist.lab import demo
from jobdist.lab.demo import results_table
from jobdist.lab.scenarios import THESIS_SCENARIOS, Result

# (makespan, ideal, revisions min, max) at 1 s steps, as docs/performance.md measured them.
MEASURED = [(3.37, 3.0, 7, 7), (9.40, 9.0, 5, 5), (6.44, 6.0, 5, 7), (4.45, 3.0, 5, 8),
            (4.55, 4.0, 7, 7), (55.14, 45.0, 5, 9)]


def results(step_seconds: float = 1.0) -> list[Result]:
    """The measured results, with the same overhead (makespan - ideal) at any step length."""
    return [Result(scenario, step_seconds, ideal * step_seconds + makespan - ideal,
                   ideal * step_seconds, thesis_optimum=0.0, revisions=[low, high],
                   statuses=collections.Counter(success=scenario.jobs))
            for scenario, (makespan, ideal, low, high) in zip(THESIS_SCENARIOS, MEASURED,
                                                               strict=True)]


def render(width: int, step_seconds: float = 1.0) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, highlight=False).print(results_table(results(step_seconds)))
    return out.getvalue().splitlines()


def test_the_thesis_is_compared_at_its_own_step_length() -> None:
    by_name = {r.scenario.name: r for r in results()}
    two = by_name["2: 3 sites, 6 jobs"]
    assert two.ratio == pytest.approx(4.45 / 3)  # at 1 s steps: the fixed cost weighs most
    assert two.ratio_at_thesis_steps == pytest.approx((15 + 1.45) / 15)  # 1.10
    assert two.thesis_ratio == pytest.approx(17 / 15)  # the thesis: 1.13
    assert by_name["1: 3 sites, 1 job"].thesis_ratio == pytest.approx(1.0)
    assert by_name["3: 2 sites, 3 jobs A,B,A"].thesis_ratio == pytest.approx(1.15)


@pytest.mark.parametrize("width", [80, 120])
def test_the_table_fits_with_every_figure(width: int) -> None:
    lines = render(width)
    assert all(cell_len(line.rstrip()) <= width for line in lines), lines
    text = " ".join(" ".join(lines).split())
    assert all(word in text for scenario in THESIS_SCENARIOS for word in scenario.name.split())
    assert "2: 3 sites, 6 jobs 6/6 4.45 3.00 1.48 1.10 1.13 5-8 (12-13)" in text
    assert "ratio = makespan ÷ ideal" in text  # the line under the table says how to read it


def test_a_wide_log_shows_each_scenario_on_one_line() -> None:
    lines = render(120)
    assert [line.split("  ")[0] for line in lines[2:8]] == [s.name for s in THESIS_SCENARIOS]


def test_short_steps_inflate_the_ratio_not_the_comparison_at_5_s() -> None:
    text = " ".join(" ".join(render(80, step_seconds=0.5)).split())
    assert "scenarios at 0.5 s steps" in text
    assert "2: 3 sites, 6 jobs 6/6 2.95 1.50 1.97 1.10 1.13" in text


def test_piped_the_demo_prints_200_columns_a_scenario_a_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    done = iter(results())
    monkeypatch.setattr(demo, "run_scenario", lambda *args, **kwargs: next(done))
    monkeypatch.setattr(demo, "check_ledger", lambda result: [])
    assert demo.run_demo(1.0) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(cell_len(line) for line in lines) <= 200
    for scenario in THESIS_SCENARIOS:  # each row whole on one line, its label unwrapped
        row = re.compile(rf"{re.escape(scenario.name)} +{scenario.jobs}/{scenario.jobs} ")
        assert any(row.match(line) for line in lines), (scenario.name, lines)
    assert any(line.startswith("ratio = ") and line.endswith("(the thesis's)") for line in lines)


def test_ctrl_c_says_what_it_stopped_and_exits_130(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from jobdist.cli import main

    done = iter(results())

    def run_scenario(scenario: object, *args: object, **kwargs: object) -> Result:
        if scenario is THESIS_SCENARIOS[2]:
            raise KeyboardInterrupt  # (the real one stops the scenario's sites on its way)
        return next(done)

    monkeypatch.setattr(demo, "run_scenario", run_scenario)
    monkeypatch.setattr(demo, "check_ledger", lambda result: [])
    outcome = CliRunner().invoke(main, ["demo", "--step-seconds", "1"])
    assert outcome.exit_code == 130, outcome.output
    assert "Aborted!" not in outcome.output
    assert (f"jobdist: demo interrupted: stopped scenario {THESIS_SCENARIOS[2].name!r} and its "
            "local sites; 2 of 6 scenarios ran") in outcome.output
    assert THESIS_SCENARIOS[1].name in outcome.output  # the table of what ran
