"""What one run of one case left behind (``TrialRecord``), and what tokens cost.

A trial is one (case, repeat): one run, or one run per message of a conversation. Its
record is small and JSON-serialisable: the store keeps it as soon as the trial ends (so a
crashed eval continues where it was), and the report is computed from records alone.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from agent_fsm.evals.context import Verdict
from agent_fsm.messages import Usage

__all__ = ["OUTPUT_KEPT", "Pricing", "TrialRecord"]

OUTPUT_KEPT = 2_000
"""Characters of a run's output kept in its record (enough to read, not a transcript)."""

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class Pricing(BaseModel):
    """What a model's tokens cost, in any currency per million tokens."""

    model_config = _FROZEN

    input_per_million: float = Field(ge=0)
    output_per_million: float = Field(ge=0)
    cached_input_per_million: float | None = Field(default=None, ge=0)
    """For the part of the input served from a prompt cache; the input price when None."""

    def cost(self, usage: Usage) -> float:
        """The cost of ``usage``."""
        cached = usage.cached_tokens if self.cached_input_per_million is not None else 0
        cached_price = self.cached_input_per_million or 0.0
        return (
            (usage.input_tokens - cached) * self.input_per_million
            + cached * cached_price
            + usage.output_tokens * self.output_per_million
        ) / 1_000_000


class TrialRecord(BaseModel):
    """One (case, repeat) of an eval: how the run went and how it was judged."""

    model_config = _FROZEN

    case: str
    repeat: int = Field(ge=0)
    passed: bool
    """Every evaluator passed, the run kept every invariant, and nothing raised."""
    verdicts: tuple[Verdict, ...] = ()
    violation: str | None = None
    """The run invariants it broke (``agent_fsm.testing.check_invariants``), or None. A
    broken run fails whatever its evaluators said."""
    error: str | None = None
    """What raised while running the case (a programming error), or None."""
    status: str | None = None
    """``RunStatus`` of the (last) run; None when no run ended."""
    stop_reason: str | None = None
    turns: int = 0
    """Model turns over the case (every run of a conversation)."""
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None
    """The agent's tokens priced (``Pricing``); None without a price."""
    latency_s: float = 0.0
    """Wall-clock time of the case's runs, evaluators not included."""
    tools_called: tuple[str, ...] = ()
    output: str | None = None
    """The (last) run's output, cut to ``OUTPUT_KEPT`` characters."""
    run_ids: tuple[str, ...] = ()
    judge_calls: int = 0
    judge_tokens: int = 0

    @property
    def broken(self) -> bool:
        """The run broke a promise of the engine (or did not end within its bound)."""
        return self.violation is not None

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def failures(self) -> list[str]:
        """Why it failed, one line each: the error, the violation, each failed verdict."""
        lines = [f"error: {self.error}"] if self.error else []
        if self.violation:
            lines.append(f"broken: {self.violation.splitlines()[0]}")
        lines += [f"{v.evaluator}: {v.reason}" for v in self.verdicts if not v.passed]
        return lines
