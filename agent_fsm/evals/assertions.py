"""``assert_pass_rate``: an eval as one assertion, for pytest (or any test runner).

    def test_the_agent_knows_its_capitals():
        assert_pass_rate(agent, "evals/capitals.yaml", repeats=5, at_least=0.9)

It fails (``EvalFailure``, an AssertionError whose message is the text report) when the
overall pass rate is below ``at_least``, when any run broke a run invariant (whatever the
rate), or when a ``baseline`` is given and a rate regressed against it (``gate``). It works
in sync and async tests alike, and returns the report when it passes.
"""

from __future__ import annotations

from pathlib import Path

from agent_fsm.agent import Agent
from agent_fsm.evals.dataset import Dataset
from agent_fsm.evals.gate import gate
from agent_fsm.evals.records import Pricing
from agent_fsm.evals.report import EvalReport
from agent_fsm.evals.report_text import report_text
from agent_fsm.evals.runner import evaluate_sync
from agent_fsm.models.base import Model

__all__ = ["EvalFailure", "assert_pass_rate"]


class EvalFailure(AssertionError):
    """An eval fell short; ``report`` holds everything it found."""

    def __init__(self, message: str, report: EvalReport) -> None:
        self.report = report
        super().__init__(f"{message}\n\n{report_text(report)}")


def assert_pass_rate(
    agent: Agent,
    dataset: Dataset | str | Path,
    *,
    repeats: int = 5,
    at_least: float = 0.9,
    concurrency: int = 4,
    judge: Model | None = None,
    max_judge_calls: int | None = None,
    pricing: Pricing | None = None,
    baseline: EvalReport | str | Path | None = None,
) -> EvalReport:
    """Run ``dataset`` against ``agent`` ``repeats`` times per case and assert that the
    overall pass rate is at least ``at_least``, that no run broke a run invariant, and (with
    a ``baseline`` report or its path) that no rate regressed beyond its uncertainty.

    Raises:
        EvalFailure: naming what fell short, with the report.
    """
    if not 0 <= at_least <= 1:
        raise ValueError(f"at_least is a pass rate between 0 and 1, got {at_least}")
    report = evaluate_sync(
        agent,
        dataset,
        repeats=repeats,
        concurrency=concurrency,
        judge=judge,
        max_judge_calls=max_judge_calls,
        pricing=pricing,
    )
    overall = report.overall
    problems = []
    if overall.broken:
        problems.append(f"{overall.broken} run(s) broke a run invariant")
    if overall.rate < at_least:
        problems.append(
            f"pass rate {overall.rate:.2f} ({overall.passed}/{overall.runs}, CI "
            f"{overall.interval}) is below {at_least}"
        )
    if baseline is not None:
        saved = baseline if isinstance(baseline, EvalReport) else EvalReport.load(baseline)
        result = gate(report, saved)
        problems += [f"regressed: {regression}" for regression in result.regressions]
    if problems:
        raise EvalFailure("; ".join(problems), report)
    return report
