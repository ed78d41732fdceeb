"""Evaluators (issue 38): exact, contains, regex, a JSON Schema or pydantic check of typed
output, a Python function, an LLM judge through a Model with its calls counted and bounded,
and trajectory checks, each on real runs of scripted models."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel, Field

from agent_fsm import Agent, ConfigError, Limits, RunResult, tool
from agent_fsm.evals import (
    CallBudget,
    Called,
    CalledInOrder,
    Check,
    Contains,
    Equals,
    EvalContext,
    Judge,
    Matches,
    MatchesSchema,
    NotCalled,
    Validates,
    Verdict,
    WithinTurns,
)
from agent_fsm.evals.context import Evaluator
from agent_fsm.messages import ModelRequest, Usage, UserMessage
from agent_fsm.testing import FunctionModel, ScriptedModel, call, reply


class Invoice(BaseModel):
    number: str
    total: float = Field(ge=0)


@tool
def lookup(country: str) -> str:
    """The capital of a country."""
    return {"france": "Paris"}.get(country.lower(), "unknown")


@tool
def delete(name: str) -> str:
    """Delete a thing."""
    return "deleted"


def run_of(*script: Any, output_type: type[BaseModel] | None = None) -> RunResult:
    agent = Agent(
        model=ScriptedModel(script),
        tools=[lookup, delete],
        limits=Limits(max_turns=6),
        output_type=output_type,
    )
    return agent.run_sync("What is the capital of France?")


def context(
    result: RunResult,
    *,
    expected: Any = None,
    judge: Any = None,
    budget: CallBudget | None = None,
) -> EvalContext:
    return EvalContext(
        case="c",
        input="What is the capital of France?",
        expected=expected,
        metadata={},
        result=result,
        turns=result.turns,
        judge=judge,
        judge_budget=budget,
    )


def verdict(evaluator: Evaluator, ctx: EvalContext) -> Verdict:
    return asyncio.run(evaluator.evaluate(ctx))


PARIS = run_of(reply("", call("lookup", country="France")), "  The capital is Paris.  ")
PARIS_ONLY = run_of("Paris")


def test_equals_compares_stripped_text_and_json_values() -> None:
    assert verdict(Equals(), context(PARIS_ONLY, expected="Paris")).passed
    assert verdict(Equals(value=" Paris "), context(PARIS_ONLY)).passed
    wrong = verdict(Equals(), context(PARIS_ONLY, expected="paris"))
    assert not wrong.passed
    assert "expected 'paris', got 'Paris'" in wrong.reason
    assert verdict(Equals(case_sensitive=False), context(PARIS_ONLY, expected="paris")).passed
    assert verdict(Equals(), context(PARIS_ONLY)).reason == "no expected output"
    typed = run_of(reply("", call("final_result", number="F-1", total=3)), output_type=Invoice)
    assert verdict(Equals(), context(typed, expected={"number": "F-1", "total": 3.0})).passed
    assert not verdict(Equals(), context(typed, expected={"number": "F-2", "total": 3.0})).passed
    json_text = run_of('{"a": [1, 2]}')
    assert verdict(Equals(value={"a": [1, 2]}), context(json_text)).passed
    assert "not JSON" in verdict(Equals(value={"a": 1}), context(PARIS_ONLY)).reason


def test_contains_and_matches() -> None:
    assert verdict(Contains(text="Paris"), context(PARIS)).passed
    assert not verdict(Contains(text="paris"), context(PARIS)).passed
    assert verdict(Contains(text="paris", case_sensitive=False), context(PARIS)).passed
    assert verdict(Matches(pattern=r"\bParis\b"), context(PARIS)).passed
    assert not verdict(Matches(pattern=r"Paris", full=True), context(PARIS)).passed
    assert verdict(
        Matches(pattern=r"paris", full=True, ignore_case=True), context(PARIS_ONLY)
    ).passed
    failed = verdict(Matches(pattern=r"^\d+$"), context(PARIS))
    assert not failed.passed
    assert "does not match" in failed.reason


def test_a_json_schema_and_a_pydantic_model_check_typed_output() -> None:
    typed = run_of(reply("", call("final_result", number="F-1", total=3)), output_type=Invoice)
    schema = {
        "type": "object",
        "required": ["number", "total"],
        "properties": {"total": {"type": "number", "maximum": 2}},
    }
    failed = verdict(MatchesSchema(json_schema=schema), context(typed))
    assert not failed.passed
    assert "total: 3.0 is greater than the maximum of 2" in failed.reason
    schema["properties"] = {"total": {"type": "number"}}
    assert verdict(MatchesSchema(json_schema=schema), context(typed)).passed
    assert verdict(Validates(model=Invoice), context(typed)).passed
    assert verdict(Validates(model=f"{__name__}:Invoice"), context(typed)).passed
    negative = run_of(json.dumps({"number": "F-1", "total": -1}))  # text output, parsed
    bad = verdict(Validates(model=Invoice), context(negative))
    assert not bad.passed
    assert "total" in bad.reason
    assert "not JSON" in verdict(Validates(model=Invoice), context(PARIS)).reason


def test_a_python_function_decides_in_every_form_it_may_answer() -> None:
    async def slow_yes(ctx: EvalContext) -> bool:
        await asyncio.sleep(0)
        return "Paris" in (ctx.output or "")

    assert verdict(Check(function=slow_yes), context(PARIS)) == Verdict(
        evaluator="slow_yes", passed=True
    )
    score = verdict(Check(function=lambda ctx: 0.25, label="score"), context(PARIS))
    assert (score.evaluator, score.passed, score.score) == ("score", False, 0.25)
    pair = verdict(Check(function=lambda ctx: (False, "too long")), context(PARIS))
    assert (pair.passed, pair.reason) == (False, "too long")
    odd = verdict(Check(function=lambda ctx: "yes"), context(PARIS))
    assert not odd.passed
    assert "returned str" in odd.reason
    referenced = verdict(Check(function=f"{__name__}:mentions_paris"), context(PARIS))
    assert referenced == Verdict(evaluator="mentions_paris", passed=True)
    raising = Check(function=f"{__name__}:no_such_function")
    with pytest.raises(ConfigError, match="has no attribute"):
        verdict(raising, context(PARIS))  # the runner turns this into a failed verdict


def test_trajectory_checks() -> None:
    both = run_of(
        reply("", call("lookup", country="France")),
        reply("", call("delete", name="x"), call("lookup", country="Spain")),
        "done",
    )
    assert verdict(Called(tools=("lookup", "delete")), context(both)).passed
    missing = verdict(Called(tools=("lookup",)), context(PARIS_ONLY))
    assert not missing.passed
    assert "never called ['lookup']" in missing.reason
    assert verdict(NotCalled(tools=("delete",)), context(PARIS)).passed
    assert not verdict(NotCalled(tools=("delete",)), context(both)).passed
    assert verdict(CalledInOrder(tools=("lookup", "lookup")), context(both)).passed
    assert verdict(CalledInOrder(tools=("delete", "lookup")), context(both)).passed
    assert not verdict(CalledInOrder(tools=("delete", "delete")), context(both)).passed
    assert not verdict(CalledInOrder(tools=("lookup", "delete"), exact=True), context(both)).passed
    assert verdict(
        CalledInOrder(tools=("lookup", "delete", "lookup"), exact=True), context(both)
    ).passed
    assert verdict(WithinTurns(turns=3), context(both)).passed
    late = verdict(WithinTurns(turns=2), context(both))
    assert not late.passed
    assert late.reason == "took 3 turns"


def mentions_paris(ctx: EvalContext) -> bool:
    return "Paris" in (ctx.output or "")


def _judge_reply(text: str) -> FunctionModel:
    def judge(request: ModelRequest) -> Any:
        return reply(text, usage=(50, 10))

    return FunctionModel(judge, name="judge")


def test_the_judge_is_asked_about_the_run_and_its_verdict_is_read() -> None:
    judge = _judge_reply('Sure. {"pass": true, "score": 0.9, "reason": "names Paris"}')
    budget = CallBudget(limit=5)
    got = verdict(
        Judge(rubric="Names the capital."),
        context(PARIS, expected="Paris", judge=judge, budget=budget),
    )
    assert got == Verdict(evaluator="judge", passed=True, score=0.9, reason="names Paris")
    prompt = judge.requests[0].messages[-1]
    assert isinstance(prompt, UserMessage)
    assert "Rubric: Names the capital." in prompt.content
    assert 'Expected answer: "Paris"' in prompt.content
    assert "['lookup']" in prompt.content
    assert "The capital is Paris." in prompt.content
    assert judge.requests[0].tools == ()
    assert (budget.made, budget.usage.total_tokens) == (1, 60)


@pytest.mark.parametrize(
    ("says", "reason"),
    [
        ("I think it is fine", "gave no verdict"),
        ('{"pass": "maybe"}', "gave no verdict"),
        ('{"pass": true, "score": 7}', "gave no verdict"),
        (RuntimeError("judge offline"), "the judge call failed: RuntimeError: judge offline"),
    ],
)
def test_a_judge_that_fails_or_gives_no_verdict_fails_the_verdict(
    says: object, reason: str
) -> None:
    def judge(request: ModelRequest) -> str:
        if isinstance(says, Exception):
            raise says
        return str(says)

    got = verdict(Judge(rubric="r"), context(PARIS, judge=FunctionModel(judge)))
    assert not got.passed
    assert reason in got.reason


def test_judge_calls_are_bounded_by_the_budget_shared_through_parents() -> None:
    judge = _judge_reply('{"pass": true}')
    shared = CallBudget(limit=3)
    verdicts = []
    for _ in range(5):
        own = CallBudget(limit=2, parent=shared)  # as each trial gets one
        verdicts.append(verdict(Judge(rubric="r"), context(PARIS, judge=judge, budget=own)))
    assert [v.passed for v in verdicts] == [True, True, True, False, False]
    assert verdicts[-1].reason == "judge budget spent (2 calls)"
    assert len(judge.requests) == shared.made == 3
    assert shared.usage == Usage(input_tokens=150, output_tokens=30, requests=3)
    no_model = verdict(Judge(rubric="r"), context(PARIS))
    assert not no_model.passed
    assert "no judge model" in no_model.reason
