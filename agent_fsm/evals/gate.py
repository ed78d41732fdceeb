"""The regression gate: did a change make the agent worse, beyond what chance explains?

The current report is compared with a saved baseline (``EvalReport.save``), case by case and
overall. A pass rate regressed when Newcombe's interval of (current − baseline) lies wholly
below zero (``stats.difference_interval``, at the current report's confidence): both rates'
uncertainty counts, so 4/5 after 5/5 is noise while 0/5 after 5/5 is not. Cases the baseline
does not have are new and cannot regress. Any run that broke a run invariant fails the gate
too, whatever the rates.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from agent_fsm.evals.report import EvalReport, Summary
from agent_fsm.evals.stats import Interval, difference_interval

__all__ = ["GateResult", "Regression", "RegressionError", "assert_no_regression", "gate"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class Regression(BaseModel):
    """A pass rate that dropped beyond its uncertainty."""

    model_config = _FROZEN

    name: str
    """The case, or ``overall``."""
    baseline: str
    """The baseline's passes, as ``passed/runs``."""
    current: str
    difference: Interval
    """The interval of current − baseline: wholly below zero."""

    def __str__(self) -> str:
        return f"{self.name}: {self.baseline} -> {self.current}, difference {self.difference}"


class GateResult(BaseModel):
    """What the gate found."""

    model_config = _FROZEN

    regressions: tuple[Regression, ...] = ()
    broken: int = 0
    """Runs of the current eval that broke a run invariant."""
    compared: tuple[str, ...] = ()
    """The cases compared (those both reports have), and ``overall``."""

    @property
    def ok(self) -> bool:
        return not self.regressions and not self.broken

    def __str__(self) -> str:
        if self.ok:
            return f"no regression ({len(self.compared)} rates compared)"
        lines = [f"regressed: {regression}" for regression in self.regressions]
        if self.broken:
            lines.append(f"{self.broken} run(s) broke a run invariant")
        return "\n".join(lines)


class RegressionError(AssertionError):
    """The gate failed; the message lists what regressed."""

    def __init__(self, result: GateResult) -> None:
        self.result = result
        super().__init__(f"the eval regressed against its baseline:\n{result}")


def _regression(current: Summary, baseline: Summary, confidence: float) -> Regression | None:
    if not current.runs or not baseline.runs:
        return None
    difference = difference_interval(
        current.passed, current.runs, baseline.passed, baseline.runs, confidence
    )
    if difference.high >= 0:
        return None
    return Regression(
        name=current.name,
        baseline=f"{baseline.passed}/{baseline.runs}",
        current=f"{current.passed}/{current.runs}",
        difference=difference,
    )


def gate(current: EvalReport, baseline: EvalReport) -> GateResult:
    """Compare ``current`` with ``baseline``: every case they share, and overall."""
    before = {summary.name: summary for summary in baseline.cases}
    pairs = [(s, before[s.name]) for s in current.cases if s.name in before]
    pairs.append((current.overall, baseline.overall))
    found = [_regression(now, then, current.confidence) for now, then in pairs]
    return GateResult(
        regressions=tuple(r for r in found if r is not None),
        broken=current.broken,
        compared=tuple(now.name for now, _ in pairs),
    )


def assert_no_regression(current: EvalReport, baseline: EvalReport) -> GateResult:
    """``gate``, raising ``RegressionError`` (an AssertionError) when it fails."""
    result = gate(current, baseline)
    if not result.ok:
        raise RegressionError(result)
    return result
