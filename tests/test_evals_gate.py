"""The regression gate (issue 38): a pass rate, per case or overall, fails the gate when it
dropped below the baseline's beyond both rates' uncertainty, and never otherwise; a broken
run fails it whatever the rates."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_fsm.evals import (
    Case,
    Dataset,
    EvalFailure,
    EvalReport,
    RegressionError,
    assert_no_regression,
    assert_pass_rate,
    evaluate_sync,
    gate,
)
from agent_fsm.evals.records import TrialRecord
from agent_fsm.evals.report import summarise
from tests.test_evals_runner import CAPITAL, agent_of, coin


def report_of(passes: dict[str, tuple[int, int]], *, broken: int = 0) -> EvalReport:
    """A report whose case ``name`` passed ``k`` of ``n`` runs, for each (k, n)."""
    trials = []
    for name, (passed, runs) in passes.items():
        for repeat in range(runs):
            violation = "a seeded violation" if broken and repeat < broken else None
            trials.append(
                TrialRecord(case=name, repeat=repeat, passed=repeat < passed, violation=violation)
            )
    repeats = max((n for _, n in passes.values()), default=0)
    return summarise(
        trials, eval_id="e", dataset="d", agent="a", cases=list(passes), repeats=repeats
    )


def test_a_collapse_regresses_and_noise_does_not() -> None:
    baseline = report_of({"a": (5, 5), "b": (5, 5)})
    noise = gate(report_of({"a": (4, 5), "b": (5, 5)}), baseline)
    assert noise.ok
    assert noise.compared == ("a", "b", "overall")
    collapse = gate(report_of({"a": (0, 5), "b": (5, 5)}), baseline)
    assert not collapse.ok
    assert [r.name for r in collapse.regressions] == ["a", "overall"]  # 5/10 after 10/10 too
    regression = collapse.regressions[0]
    assert (regression.baseline, regression.current) == ("5/5", "0/5")
    assert regression.difference.high < 0
    assert "a: 5/5 -> 0/5" in str(collapse)


def test_the_overall_rate_regresses_when_many_cases_slip_a_little() -> None:
    names = [f"c{i}" for i in range(8)]
    baseline = report_of(dict.fromkeys(names, (10, 10)))
    slipped = gate(report_of(dict.fromkeys(names, (7, 10))), baseline)
    assert [r.name for r in slipped.regressions] == ["overall"]  # no case alone is sure


def test_new_cases_cannot_regress_and_broken_runs_fail_the_gate() -> None:
    baseline = report_of({"a": (5, 5)})
    assert gate(report_of({"a": (5, 5), "new": (0, 5)}), baseline).compared == ("a", "overall")
    broken = gate(report_of({"a": (5, 5)}, broken=1), baseline)
    assert not broken.ok
    assert "1 run(s) broke a run invariant" in str(broken)
    with pytest.raises(RegressionError, match="regressed against its baseline"):
        assert_no_regression(report_of({"a": (0, 5)}), baseline)
    assert assert_no_regression(report_of({"a": (5, 5)}), baseline).ok


@settings(max_examples=300)
@given(
    st.integers(1, 30).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))),
    st.integers(1, 30).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))),
)
def test_the_gate_is_monotone_in_the_current_passes(
    current: tuple[int, int], base: tuple[int, int]
) -> None:
    """One pass fewer never turns a regression into none; one more never makes one; the
    same rate as the baseline never regresses."""
    baseline = report_of({"a": base})
    regressed = not gate(report_of({"a": current}), baseline).ok
    passed, runs = current
    if passed > 0 and regressed:
        assert not gate(report_of({"a": (passed - 1, runs)}), baseline).ok
    if passed < runs and not regressed:
        assert gate(report_of({"a": (passed + 1, runs)}), baseline).ok
    assert gate(report_of({"a": base}), baseline).ok


def test_a_saved_report_is_a_baseline_for_assert_pass_rate(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    good = evaluate_sync(agent_of(coin(11, 1.0)), CAPITAL, repeats=8)
    good.save(path)
    assert EvalReport.load(path) == good
    assert_pass_rate(agent_of(coin(12, 1.0)), CAPITAL, repeats=8, at_least=0.9, baseline=path)
    with pytest.raises(EvalFailure, match="regressed: overall"):
        assert_pass_rate(agent_of(coin(13, 0.2)), CAPITAL, repeats=8, at_least=0.0, baseline=path)


def test_a_changed_dataset_gates_only_the_cases_both_ran() -> None:
    baseline = evaluate_sync(agent_of(coin(1, 1.0)), CAPITAL, repeats=4)
    grown = Dataset(cases=(*CAPITAL.cases, Case(name="italy", input="Capital of Italy?")))
    current = evaluate_sync(agent_of(coin(1, 1.0)), grown, repeats=4)
    assert gate(current, baseline).compared == ("france", "spain", "overall")
