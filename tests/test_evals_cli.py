"""``agent-fsm eval DATASET --agent module:attr`` (issue 38): the example dataset against the
example's offline agent, a report as text, JSON and HTML, a progress bar, results in the
store, a gate that fails a worse agent, and exit code 2 for every usage error."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent_fsm.cli import main
from agent_fsm.evals import EvalReport, EvalStore

ROOT = Path(__file__).resolve().parent.parent
DATASET = str(ROOT / "examples" / "evals" / "capitals.yaml")
EXAMPLE = ROOT / "examples" / "evals_capitals.py"

WORSE = """
from agent_fsm import Agent
from agent_fsm.testing import FunctionModel


def agent() -> Agent:
    return Agent(model=FunctionModel(lambda request: "Sydney"))
"""


def _eval(tmp_path: Path, *options: str, agent: str = f"{EXAMPLE}:offline_agent") -> list[str]:
    return [
        "eval",
        DATASET,
        "--agent",
        agent,
        "--judge",
        f"{EXAMPLE}:offline_judge",
        "--store",
        str(tmp_path / "evals.sqlite3"),
        *options,
    ]


def test_the_example_dataset_passes_and_writes_every_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, page = tmp_path / "base.json", tmp_path / "report.html"
    argv = _eval(tmp_path, "--repeats", "2", "--json", str(base), "--html", str(page))
    code = main([*argv, "--at-least", "1.0", "--eval-id", "first", "--price", "0.5", "1.5"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert re.search(r"\noverall +8/8 +1\.00 +\[0\.68, 1\.00\] +0 ", out), out
    assert "judge: 2 call(s)" in out
    assert "cost:" in out
    assert "[##############################] 8/8 passed 8 failed 0 broken 0" in err
    assert "continue it: --eval-id first" in err
    report = EvalReport.load(base)
    assert (report.eval_id, report.repeats, report.overall.passed) == ("first", 2, 8)
    assert report.agent == f"{EXAMPLE}:offline_agent"
    assert "<svg" in page.read_text()
    with EvalStore(tmp_path / "evals.sqlite3") as store:
        assert [(e.eval_id, e.recorded) for e in store.evals()] == [("first", 8)]
    # the same eval id again: every trial is recorded, none runs again
    assert main([*argv, "--eval-id", "first", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "8/8" in out
    assert "[" not in err.replace("[0.", "")


def test_the_gate_fails_a_worse_agent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "base.json"
    assert main(_eval(tmp_path, "--repeats", "3", "--json", str(base), "--no-progress")) == 0
    worse = tmp_path / "worse.py"
    worse.write_text(WORSE)
    capsys.readouterr()
    argv = _eval(tmp_path, "--repeats", "3", "--baseline", str(base), agent=f"{worse}:agent")
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "gate: regressed: france: 3/3 -> 0/3, difference [-1.00, -0.21]" in out
    assert "\nregressed: overall: 12/12 -> 0/12, difference [-1.00, -0.66]" in out
    assert main([*argv[:-2], "--at-least", "0.5"]) == 1  # no baseline: the rate alone fails
    assert "FAILED: pass rate 0.00 is below 0.5" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({1: "missing.yaml"}, "cannot read the dataset"),
        ({3: "no_such_module:agent"}, "no module named 'no_such_module'"),
        ({5: f"{EXAMPLE}:CAPITALS"}, "is no Model"),
        ({"extra": ["--repeats", "0"]}, "at least 1"),
        ({"extra": ["--baseline", "missing.json"]}, "cannot read the report"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: dict[object, object],
    message: str,
) -> None:
    argv = _eval(tmp_path)
    for where, value in change.items():
        if where == "extra":
            argv += list(value)  # type: ignore[call-overload]
        else:
            argv[where] = str(value)  # type: ignore[index]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") <= 2  # the eval id line at most, and the error


def test_the_json_report_reads_back(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    assert main(_eval(tmp_path, "--json", str(target), "--no-progress")) == 0
    data = json.loads(target.read_text())
    assert [case["name"] for case in data["cases"]][:2] == ["france", "australia"]
    assert data["overall"]["stop_reasons"] == {"final_answer": 4}
