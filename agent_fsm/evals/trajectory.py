"""Evaluators of the path a run took, not its answer: which tools the model called (or did
not), in which order, and within how many turns."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agent_fsm.evals.context import EvalContext, Verdict

__all__ = ["Called", "CalledInOrder", "NotCalled", "WithinTurns"]

_SPEC = ConfigDict(frozen=True, extra="forbid")


class Called(BaseModel):
    """Every tool of ``tools`` was called at least once."""

    model_config = _SPEC

    kind: Literal["called"] = "called"
    tools: tuple[str, ...] = Field(min_length=1)

    @property
    def name(self) -> str:
        return f"called({', '.join(self.tools)})"

    async def evaluate(self, context: EvalContext) -> Verdict:
        called = set(context.tools_called)
        missing = [tool for tool in self.tools if tool not in called]
        reason = f"never called {missing}; called {context.tools_called}" if missing else ""
        return Verdict(evaluator=self.name, passed=not missing, reason=reason)


class NotCalled(BaseModel):
    """No tool of ``tools`` was called."""

    model_config = _SPEC

    kind: Literal["not_called"] = "not_called"
    tools: tuple[str, ...] = Field(min_length=1)

    @property
    def name(self) -> str:
        return f"not_called({', '.join(self.tools)})"

    async def evaluate(self, context: EvalContext) -> Verdict:
        called = set(context.tools_called)
        wrong = [tool for tool in self.tools if tool in called]
        reason = f"called {wrong}" if wrong else ""
        return Verdict(evaluator=self.name, passed=not wrong, reason=reason)


class CalledInOrder(BaseModel):
    """``tools`` were called in this order: a subsequence of the calls made, so other calls
    may come between them (set ``exact`` to allow none, before, between or after)."""

    model_config = _SPEC

    kind: Literal["called_in_order"] = "called_in_order"
    tools: tuple[str, ...] = Field(min_length=1)
    exact: bool = False

    @property
    def name(self) -> str:
        return f"called_in_order({' > '.join(self.tools)})"

    async def evaluate(self, context: EvalContext) -> Verdict:
        called = context.tools_called
        if self.exact:
            ok = tuple(called) == self.tools
        else:
            remaining = iter(called)
            ok = all(tool in remaining for tool in self.tools)  # consumes: a subsequence
        reason = "" if ok else f"called {called}"
        return Verdict(evaluator=self.name, passed=ok, reason=reason)


class WithinTurns(BaseModel):
    """The case took at most ``turns`` model turns (every run of a conversation)."""

    model_config = _SPEC

    kind: Literal["within_turns"] = "within_turns"
    turns: int = Field(ge=1)

    @property
    def name(self) -> str:
        return f"within_turns({self.turns})"

    async def evaluate(self, context: EvalContext) -> Verdict:
        ok = context.turns <= self.turns
        reason = "" if ok else f"took {context.turns} turns"
        return Verdict(evaluator=self.name, passed=ok, reason=reason)
