"""What an evaluator is given, what it answers, and the budget an LLM judge draws from.

An evaluator looks at one finished run of one case (``EvalContext``) and answers a
``Verdict``: passed or not, an optional score, and why. It never raises for what the run
did: the runner turns an evaluator that raises into a failed verdict naming the exception,
as the engine turns a crashing tool into an error result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, JsonValue

from agent_fsm.messages import AssistantMessage, ToolCall, Usage
from agent_fsm.models.base import Model
from agent_fsm.state import RunResult

__all__ = ["CallBudget", "EvalContext", "Evaluator", "Verdict"]


class Verdict(BaseModel):
    """One evaluator's answer about one run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    evaluator: str
    """The evaluator's name (its ``kind``, or the name it was given)."""
    passed: bool
    score: float | None = None
    """A graded score in [0, 1] where the evaluator has one (a judge's), else None."""
    reason: str = ""
    """Why it failed (or, for a judge, its reasoning); empty when there is nothing to say."""


@dataclass(slots=True)
class CallBudget:
    """How many model calls LLM judges may make, shared by all of them in one eval.

    A judge claims a call before it makes it (``take``); once ``limit`` calls were made the
    judge fails its verdict with "judge budget spent" instead of calling, so an eval of many
    cases never makes more judge calls than it was allowed. ``usage`` adds up what the
    judges' replies reported: the report shows it apart from the agent's own. Each run of a
    case gets a budget of its own whose ``parent`` is the eval's: it counts that run's calls,
    and the parent all of them.
    """

    limit: int
    made: int = 0
    usage: Usage = field(default_factory=Usage)
    parent: CallBudget | None = None

    def take(self) -> bool:
        """Claim one call; False when this budget or its parent's is spent."""
        if self.made >= self.limit or (self.parent is not None and not self.parent.take()):
            return False
        self.made += 1
        return True

    def spend(self, usage: Usage) -> None:
        """Add the usage of a call made (to the parent's too)."""
        self.usage = self.usage + usage
        if self.parent is not None:
            self.parent.spend(usage)


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalContext:
    """One finished run of one case, as evaluators see it."""

    case: str
    """The case's name."""
    input: str | tuple[str, ...]
    """What the user said: one message, or each message of a conversation in order."""
    expected: JsonValue
    """The case's expected output (None when it gives none)."""
    metadata: dict[str, JsonValue]
    result: RunResult
    """The run (for a conversation, its last run: its transcript holds every turn)."""
    turns: int
    """Model turns over the whole case (every run of a conversation)."""
    judge: Model | None = None
    """The model LLM judges call, when the eval was given one."""
    judge_budget: CallBudget | None = None

    @property
    def output(self) -> str | None:
        return self.result.output

    @property
    def value(self) -> Any:
        """The typed output (``Agent(output_type=...)``), or None."""
        return self.result.value

    @property
    def tool_calls(self) -> Sequence[ToolCall]:
        """Every tool call the model made, in order, control tools included."""
        return [
            call
            for message in self.result.messages
            if isinstance(message, AssistantMessage)
            for call in message.tool_calls
        ]

    @property
    def tools_called(self) -> list[str]:
        """The names of ``tool_calls``, in order."""
        return [call.name for call in self.tool_calls]

    @property
    def last_input(self) -> str:
        return self.input if isinstance(self.input, str) else self.input[-1]


@runtime_checkable
class Evaluator(Protocol):
    """Anything that can judge a run: the built-ins are pydantic models (so a dataset can
    carry them in YAML or JSON); a Python function is wrapped in ``Check``."""

    @property
    def name(self) -> str:
        """What the report calls it."""
        ...

    async def evaluate(self, context: EvalContext) -> Verdict:
        """Judge one run. May raise: the runner records that as a failed verdict."""
        ...
