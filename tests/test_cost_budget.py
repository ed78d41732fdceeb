"""A money budget (``Limits(cost_budget=..., prices=...)``): every call priced, the run's cost
reported, and a run out of money stopped before its next call, by a row of its own."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from agent_fsm import Agent, ConfigError, Limits, Pricing, StopReason
from agent_fsm.evals.records import Pricing as EvalsPricing
from agent_fsm.events import ModelResponded, RunFinished
from agent_fsm.hooks import ModelPlan, StepHooks
from agent_fsm.messages import ModelRequest, ModelResponse, Usage
from agent_fsm.state import RunResult, RunStatus
from agent_fsm.testing import FunctionModel, ScriptedModel, assert_terminates, call, reply
from agent_fsm.testing.invariants import InvariantViolation, check_invariants
from tests.conftest import FAST, Recorder, echo

PRICE = Pricing(input_per_million=1_000_000.0, output_per_million=2_000_000.0)
"""One unit per input token, two per output token: costs read as token counts."""
CHEAP_IN = Pricing(input_per_million=1_000.0, output_per_million=10_000_000.0)
"""A thousandth per input token, ten per output token: prompts cost next to nothing."""


def priced(**overrides: object) -> Limits:
    return Limits(**{**FAST, "prices": {"scripted": PRICE}, **overrides})


def run(agent: Agent, text: str = "go") -> tuple[Recorder, RunResult]:
    recorder = Recorder()
    result = agent.subscribe(recorder).run_sync(text)
    check_invariants(
        result, limits=agent.limits, bound=agent.bound, events=recorder, rows=agent.machine.rows
    )
    return recorder, result


def test_pricing_prices_each_kind_of_token() -> None:
    usage = Usage(input_tokens=1000, output_tokens=500, cached_tokens=400, reasoning_tokens=100)
    plain = Pricing(input_per_million=2.0, output_per_million=8.0)
    assert plain.cost(usage) == pytest.approx((1000 * 2.0 + 500 * 8.0) / 1e6)
    kinds = Pricing(
        input_per_million=2.0,
        output_per_million=8.0,
        cached_input_per_million=0.5,
        reasoning_per_million=4.0,
    )
    assert kinds.cost(usage) == pytest.approx((600 * 2.0 + 400 * 0.5 + 400 * 8.0 + 100 * 4.0) / 1e6)
    # a server that reports more cached tokens than input is not paid back
    odd = Usage(input_tokens=10, output_tokens=0, cached_tokens=50)
    assert kinds.cost(odd) == pytest.approx(10 * 0.5 / 1e6)
    # one price type: the evals report prices with the same one
    assert EvalsPricing is Pricing


def test_a_priced_run_reports_its_cost_and_each_call_its_own() -> None:
    model = ScriptedModel(
        [reply("", call("echo", text="a"), usage=(10, 2)), reply("ok", usage=(20, 3))]
    )
    agent = Agent(model=model, tools=[echo], limits=priced())
    events, result = run(agent)
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.cost == pytest.approx(10 + 2 * 2 + 20 + 3 * 2)
    assert [e.cost for e in events if isinstance(e, ModelResponded)] == [14.0, 26.0]
    (finished,) = [e for e in events if isinstance(e, RunFinished)]
    assert finished.cost == result.cost


def test_an_agent_without_prices_reports_no_cost() -> None:
    agent = Agent(model=ScriptedModel(["ok"]), limits=Limits(**FAST))
    events, result = run(agent)
    assert result.cost is None
    assert [e.cost for e in events if isinstance(e, ModelResponded)] == [None]
    assert {"prompt_exceeds_cost_budget", "cost_budget_spent"} <= agent.run_config.dead_guards


def test_spent_money_stops_the_run_before_its_next_call() -> None:
    """Each call costs 20.01; a budget of 50 pays three (40.02 spent, and a prompt of a few
    hundred tokens costs a few tenths, when the third starts) and stops the run in REFLECT,
    by its own row: the fourth call is never made."""
    turns = itertools.count()

    def busy(request: ModelRequest) -> ModelResponse:
        return reply("", call("echo", text=f"t{next(turns)}"), usage=(10, 2))

    model = FunctionModel(busy, name="scripted")
    limits = priced(cost_budget=50.0, prices={"scripted": CHEAP_IN})
    agent = Agent(model=model, tools=[echo], limits=limits)
    _, result = run(agent)
    assert result.stop_reason is StopReason.COST_BUDGET
    assert result.status is RunStatus.FAILED
    assert len(model.requests) == 3
    assert result.cost == pytest.approx(3 * 20.01)
    assert result.trace[-1].guards == ("cost_budget_spent",)
    assert result.error is not None
    assert "cost budget of 50 spent" in result.error


def test_a_prompt_the_money_left_cannot_pay_is_not_sent() -> None:
    """Checked before the call, like the token budget: a prompt whose estimate, priced at
    the highest input price known, does not fit in what is left is never sent."""
    model = ScriptedModel(["never sent"])
    agent = Agent(model=model, limits=priced(cost_budget=3.0))
    _, result = run(agent, "a prompt of more than three tokens, surely")
    assert result.stop_reason is StopReason.COST_BUDGET
    assert result.trace[-1].guards == ("prompt_exceeds_cost_budget",)
    assert model.requests == []
    assert result.cost is None


def test_no_last_answer_once_the_money_is_spent() -> None:
    """A last answer is a call like any other: the limits that want one do not get it once
    the money is spent (the token budget's stop fires, plainly)."""
    turns = itertools.count()

    def busy(request: ModelRequest) -> ModelResponse:
        return reply("", call("echo", text=f"t{next(turns)}"), usage=(190, 10))

    model = FunctionModel(busy, name="scripted")
    limits = priced(
        cost_budget=100.0, token_budget=200, last_answer=True, prices={"scripted": CHEAP_IN}
    )
    agent = Agent(model=model, tools=[echo], limits=limits)
    _, result = run(agent)
    assert result.stop_reason is StopReason.TOKEN_BUDGET  # it ranks first
    assert result.last_answers == 0
    assert len(model.requests) == 1


def test_cost_budget_needs_a_price_for_the_agents_model() -> None:
    with pytest.raises(ConfigError, match="cost_budget needs prices"):
        Limits(cost_budget=1.0)
    with pytest.raises(ConfigError, match="no price for the agent's model 'scripted'"):
        Agent(model=ScriptedModel([]), limits=Limits(prices={"other": PRICE}))
    with pytest.raises(ConfigError, match="cost_budget"):
        Limits(cost_budget=0.0, prices={"scripted": PRICE})
    limits = Limits(cost_budget=1.0, prices={"b": PRICE, "a": PRICE})
    assert [name for name, _ in limits.prices] == ["a", "b"]
    assert hash(limits) == hash(Limits(cost_budget=1.0, prices={"a": PRICE, "b": PRICE}))


def test_the_invariant_catches_a_call_made_with_the_money_spent() -> None:
    """A seeded bug: a run whose second call started after the budget was spent."""
    model = ScriptedModel(
        [reply("", call("echo", text="a"), usage=(10, 2)), reply("ok", usage=(10, 2))]
    )
    agent = Agent(model=model, tools=[echo], limits=priced())
    recorder = Recorder()
    result = agent.subscribe(recorder).run_sync("go")
    with pytest.raises(InvariantViolation, match="started with the cost budget of 14"):
        check_invariants(result, limits=priced(cost_budget=14.0), events=recorder)


def test_a_cost_budget_agent_terminates_whatever_its_model_does() -> None:
    agent = Agent(
        model=ScriptedModel([]),
        tools=[echo],
        limits=Limits(
            max_turns=6,
            cost_budget=0.05,
            prices={"scripted": Pricing(input_per_million=200.0, output_per_million=800.0)},
        ),
    )
    assert_terminates(agent, max_examples=120)


def test_a_model_chosen_by_a_hook_is_priced_at_its_own_price() -> None:
    """A ``before_model`` hook sends the call to another model: its reply is priced at that
    model's price, not the agent's; a model the prices do not cover is refused (a permanent
    model error naming it), not counted as free."""
    big = ScriptedModel([reply("big answer", usage=(100, 10))], name="big")
    prices = {
        "small": Pricing(input_per_million=1.0, output_per_million=2.0),
        "big": Pricing(input_per_million=100.0, output_per_million=200.0),
    }

    def to_big(plan: ModelPlan) -> ModelPlan:
        return dataclasses.replace(plan, model=big)

    agent = Agent(
        model=ScriptedModel([], name="small"),
        hooks=StepHooks(before_model=to_big),
        limits=Limits(**FAST, cost_budget=1.0, prices=prices),
    )
    events, result = run(agent)
    assert result.output == "big answer"
    assert result.cost == pytest.approx((100 * 100 + 10 * 200) / 1e6)
    (responded,) = [e for e in events if isinstance(e, ModelResponded)]
    assert responded.cost == pytest.approx(result.cost)

    stranger = ScriptedModel(["never"], name="stranger")

    def to_stranger(plan: ModelPlan) -> ModelPlan:
        return dataclasses.replace(plan, model=stranger)

    for limits in (Limits(**FAST, cost_budget=1.0, prices=prices), Limits(**FAST, prices=prices)):
        refused = Agent(
            model=ScriptedModel([], name="small"),
            hooks=StepHooks(before_model=to_stranger),
            limits=limits,
        )
        _, result = run(refused)
        assert result.stop_reason is StopReason.MODEL_ERROR
        assert "chose the model 'stranger', which Limits.prices does not price" in (
            result.error or ""
        )
        assert stranger.requests == []
    # without prices nothing is priced, whichever model is chosen
    free = Agent(
        model=ScriptedModel([], name="small"),
        hooks=StepHooks(before_model=to_stranger),
        limits=Limits(**FAST),
    )
    assert run(free)[1].cost is None
