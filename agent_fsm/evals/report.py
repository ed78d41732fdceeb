"""The report of an eval: per case and overall, how often the agent was right (with a Wilson
interval), how many runs broke a promise, and what the runs cost (tokens, money, time,
turns: median and p90) and how they stopped.

A report is computed from trial records alone (``summarise``), so a resumed eval's report is
the same as an uninterrupted one's. Saved as JSON, it is the baseline a later eval is gated
against (``agent_fsm.evals.gate``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent_fsm.errors import ConfigError
from agent_fsm.evals.records import TrialRecord
from agent_fsm.evals.stats import Interval, Spread, spread, wilson_interval

__all__ = ["EvalReport", "Summary", "summarise"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")

FAILURES_KEPT = 3
"""Distinct failure reasons a summary keeps (the records hold every one)."""


class Summary(BaseModel):
    """The runs of one case, or of the whole eval."""

    model_config = _FROZEN

    name: str
    runs: int
    passed: int
    rate: float
    """passed / runs (0 with no runs)."""
    interval: Interval
    """Wilson's interval of the pass rate at the report's confidence."""
    broken: int
    """Runs that broke a run invariant: each fails whatever its score."""
    errors: int
    """Runs where something raised."""
    turns: Spread
    tokens: Spread
    cost: Spread | None
    """None when no run was priced."""
    latency_s: Spread
    stop_reasons: dict[str, int]
    """How many runs stopped each way (``StopReason`` values; ``none`` when none ended)."""
    failures: tuple[str, ...] = ()
    """A few distinct reasons runs failed."""


class EvalReport(BaseModel):
    """Everything an eval found."""

    model_config = _FROZEN

    eval_id: str
    dataset: str
    agent: str
    """How the agent was named (a reference, or its repr)."""
    repeats: int
    confidence: float = 0.95
    cases: tuple[Summary, ...]
    overall: Summary
    judge_calls: int = 0
    judge_tokens: int = 0
    trials: tuple[TrialRecord, ...] = Field(default=(), repr=False)

    @property
    def broken(self) -> int:
        """Runs that broke a run invariant: any fails the eval, whatever the pass rate."""
        return self.overall.broken

    def case(self, name: str) -> Summary:
        """The summary of case ``name``; KeyError if there is none."""
        for summary in self.cases:
            if summary.name == name:
                return summary
        raise KeyError(name)

    def save(self, path: str | Path) -> None:
        """Write the report as JSON (a baseline for ``gate``)."""
        Path(path).write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> EvalReport:
        """Read a report ``save`` wrote. Raises ConfigError naming the file."""
        try:
            return cls.model_validate_json(Path(path).read_bytes())
        except OSError as exc:
            raise ConfigError(f"cannot read the report {str(path)!r}: {exc}") from None
        except ValidationError as exc:
            raise ConfigError(f"{path} is not an eval report: {exc}") from None


def _summary(name: str, trials: Sequence[TrialRecord], confidence: float) -> Summary:
    passed = sum(t.passed for t in trials)
    costs = [t.cost for t in trials if t.cost is not None]
    reasons: list[str] = []
    for trial in trials:
        for line in trial.failures:
            if line not in reasons and len(reasons) < FAILURES_KEPT:
                reasons.append(line)
    return Summary(
        name=name,
        runs=len(trials),
        passed=passed,
        rate=passed / len(trials) if trials else 0.0,
        interval=wilson_interval(passed, len(trials), confidence),
        broken=sum(t.broken for t in trials),
        errors=sum(t.error is not None for t in trials),
        turns=spread([t.turns for t in trials]),
        tokens=spread([t.tokens for t in trials]),
        cost=spread(costs) if costs else None,
        latency_s=spread([t.latency_s for t in trials]),
        stop_reasons=dict(Counter(t.stop_reason or "none" for t in trials).most_common()),
        failures=tuple(reasons),
    )


def summarise(
    trials: Sequence[TrialRecord],
    *,
    eval_id: str,
    dataset: str,
    agent: str,
    cases: Sequence[str],
    repeats: int,
    confidence: float = 0.95,
) -> EvalReport:
    """The report of ``trials``, with one summary per name of ``cases``, in that order."""
    ordered = sorted(
        trials, key=lambda t: (cases.index(t.case) if t.case in cases else -1, t.repeat)
    )
    return EvalReport(
        eval_id=eval_id,
        dataset=dataset,
        agent=agent,
        repeats=repeats,
        confidence=confidence,
        cases=tuple(
            _summary(name, [t for t in ordered if t.case == name], confidence) for name in cases
        ),
        overall=_summary("overall", ordered, confidence),
        judge_calls=sum(t.judge_calls for t in ordered),
        judge_tokens=sum(t.judge_tokens for t in ordered),
        trials=tuple(ordered),
    )
