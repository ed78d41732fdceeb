"""An LLM judge: a model grades the answer against a rubric.

The judge is any ``Model`` (an adapter to a real provider, or a ``FunctionModel`` in tests),
given to the eval, not to the dataset: a dataset names what to judge, the run decides who
judges. Each judgement is one model call, claimed from the eval's ``CallBudget`` first: an
eval never makes more judge calls than it was allowed, and the report counts them and their
tokens apart from the agent's. A call that fails, a reply that is no verdict, or a spent
budget fails the verdict and says why: judging never stops the eval.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agent_fsm.evals.context import EvalContext, Verdict
from agent_fsm.messages import ModelRequest, SystemMessage, Usage, UserMessage

__all__ = ["JUDGE_INSTRUCTIONS", "Judge"]

JUDGE_INSTRUCTIONS = (
    "You grade an AI assistant's answer against a rubric. Read the rubric, the user's "
    "request, the expected answer if one is given, and the assistant's answer. Reply with "
    'JSON only, no other text: {"pass": true or false, "score": a number from 0 to 1, '
    '"reason": "one sentence"}.'
)


class _Reply(BaseModel):
    passed: bool = Field(alias="pass")
    score: float | None = Field(default=None, ge=0, le=1)
    reason: str = ""


class Judge(BaseModel):
    """A model judges the answer by ``rubric`` (the eval's judge model, ``judge=``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["judge"] = "judge"
    rubric: str = Field(min_length=1)
    show_tools: bool = True
    """Tell the judge which tools the run called, in order (for rubrics about the path)."""

    @property
    def name(self) -> str:
        return "judge"

    def prompt(self, context: EvalContext) -> str:
        """What the judge is asked about one run."""
        parts = [f"Rubric: {self.rubric}", f"User request: {context.last_input}"]
        if context.expected is not None:
            parts.append(f"Expected answer: {json.dumps(context.expected, ensure_ascii=False)}")
        if self.show_tools:
            parts.append(f"Tools the assistant called, in order: {context.tools_called or 'none'}")
        parts.append(f"Assistant's answer: {context.output if context.output is not None else ''}")
        return "\n\n".join(parts)

    async def evaluate(self, context: EvalContext) -> Verdict:
        model, budget = context.judge, context.judge_budget
        if model is None:
            return Verdict(
                evaluator=self.name, passed=False, reason="no judge model was given (judge=)"
            )
        if budget is not None and not budget.take():
            return Verdict(
                evaluator=self.name,
                passed=False,
                reason=f"judge budget spent ({budget.limit} calls)",
            )
        request = ModelRequest(
            messages=[
                SystemMessage(content=JUDGE_INSTRUCTIONS),
                UserMessage(content=self.prompt(context)),
            ],
            tools=(),
            run_id=f"judge-{context.result.run_id}",
            turn=1,
        )
        try:
            response = await model.request(request)
        except Exception as exc:  # a judge failure is a failed verdict, never a crash
            return Verdict(
                evaluator=self.name,
                passed=False,
                reason=f"the judge call failed: {type(exc).__name__}: {exc}",
            )
        if budget is not None:
            budget.spend(response.usage or Usage(requests=1))
        return _read(self.name, response.message.content)


def _read(name: str, text: str) -> Verdict:
    """The verdict in the judge's reply: the outermost JSON object in it."""
    start, end = text.find("{"), text.rfind("}")
    try:
        if start < 0 or end < start:
            raise ValueError("no JSON object")
        reply = _Reply.model_validate(json.loads(text[start : end + 1]))
    except ValueError as exc:
        return Verdict(
            evaluator=name,
            passed=False,
            reason=f"the judge gave no verdict ({type(exc).__name__}): {text[:200]!r}",
        )
    return Verdict(evaluator=name, passed=reply.passed, score=reply.score, reason=reply.reason)
