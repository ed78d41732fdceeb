"""Running an eval (issue 38): repeats and pass rates from seeded-random models, tokens,
cost, latency and turns, stop reasons, concurrency within its limit, conversations, and the
run invariants catching a seeded broken run whatever its score."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from agent_fsm import Agent, Limits, tool
from agent_fsm.evals import (
    Called,
    Case,
    Check,
    Contains,
    Dataset,
    EvalFailure,
    EvalReport,
    Pricing,
    assert_pass_rate,
    evaluate,
    evaluate_sync,
    report_text,
)
from agent_fsm.messages import ModelRequest, ModelResponse, ToolMessage, UserMessage
from agent_fsm.testing import FunctionModel, call, reply
from tests.conftest import drop_the_last_tool_result


@tool
def lookup(country: str) -> str:
    """The capital of a country."""
    return {"france": "Paris", "spain": "Madrid"}.get(country.lower(), "unknown")


CAPITAL = Dataset(
    name="capital",
    cases=(
        Case(name="france", input="Capital of France?", expected_output="Paris"),
        Case(name="spain", input="Capital of Spain?", expected_output="Madrid"),
    ),
)


def agent_of(model: Any, **options: Any) -> Agent:
    return Agent(model=model, tools=[lookup], limits=Limits(max_turns=4), **options)


def coin(seed: int, right: float) -> FunctionModel:
    """Answers right with probability ``right``, from a seeded generator: one call a run."""
    draws = random.Random(seed)

    def answer(request: ModelRequest) -> ModelResponse:
        question = str(request.messages[-1].content)
        city = "Paris" if "France" in question else "Madrid"
        return reply(city if draws.random() < right else "Rome", usage=(100, 5))

    return FunctionModel(answer)


@pytest.mark.parametrize("seed", [1, 7, 2024])
def test_pass_rates_count_every_repeat_of_a_seeded_random_model(seed: int) -> None:
    repeats = 20
    report = evaluate_sync(agent_of(coin(seed, 0.7)), CAPITAL, repeats=repeats, concurrency=3)
    draws = random.Random(seed)
    expected = sum(draws.random() < 0.7 for _ in range(2 * repeats))  # one draw per run
    overall = report.overall
    assert (overall.runs, overall.passed) == (40, expected)
    assert overall.rate == expected / 40
    assert overall.interval.low < overall.rate < overall.interval.high
    assert sum(case.passed for case in report.cases) == expected
    assert [case.runs for case in report.cases] == [repeats, repeats]
    assert {(t.case, t.repeat) for t in report.trials} == {
        (c, r) for c in ("france", "spain") for r in range(repeats)
    }
    assert overall.broken == 0
    assert report.broken == 0


def test_tokens_cost_turns_and_stop_reasons_are_summarised() -> None:
    def model(request: ModelRequest) -> ModelResponse:
        question = str(next(m for m in request.messages if isinstance(m, UserMessage)).content)
        last = request.messages[-1]
        if "loop" in question:  # the same lookup, the same answer: a loop, after 3 turns
            return reply("", call("lookup", country=f"x{request.turn}"), usage=(200, 10))
        if isinstance(last, ToolMessage):
            return reply(f"It is {last.content}.", usage=(300, 20))
        return reply("", call("lookup", country="France"), usage=(100, 10))

    dataset = Dataset(
        cases=(
            Case(name="lookup", input="Capital of France?", evaluators=(Contains(text="Paris"),)),
            Case(name="loop", input="loop forever", evaluators=(Contains(text="Paris"),)),
        )
    )
    pricing = Pricing(input_per_million=2.0, output_per_million=10.0)
    report = evaluate_sync(agent_of(FunctionModel(model)), dataset, repeats=3, pricing=pricing)
    lookup_case, loop_case = report.cases
    assert (lookup_case.passed, loop_case.passed) == (3, 0)
    assert lookup_case.turns.median == lookup_case.turns.p90 == 2
    assert lookup_case.tokens.median == 430
    assert lookup_case.tokens.total == 3 * 430
    assert lookup_case.cost is not None
    assert lookup_case.cost.median == pytest.approx((400 * 2 + 30 * 10) / 1e6)
    assert loop_case.turns.median == 3
    assert loop_case.stop_reasons == {"loop_detected": 3}
    assert report.overall.stop_reasons == {"final_answer": 3, "loop_detected": 3}
    assert report.overall.latency_s.count == 6
    assert report.overall.latency_s.median is not None
    assert any("not in" in line for line in loop_case.failures)
    text = report_text(report)
    assert "stop reasons: final_answer 3, loop_detected 3" in text
    assert "lookup" in text
    assert "3/3" in text
    assert "0/3" in text


def test_concurrency_stays_within_its_limit_and_uses_it() -> None:
    in_flight = 0
    most = 0

    async def slow(request: ModelRequest) -> str:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        for _ in range(5):
            await asyncio.sleep(0)  # let every other run that may start, start
        in_flight -= 1
        return "Paris"

    dataset = Dataset(cases=tuple(Case(name=f"c{i}", input="Capital of France?") for i in range(6)))
    report = evaluate_sync(agent_of(FunctionModel(slow)), dataset, repeats=3, concurrency=4)
    assert report.overall.runs == 18
    assert most == 4
    evaluate_sync(agent_of(FunctionModel(slow)), dataset, repeats=1, concurrency=1)
    assert most == 4  # unchanged: one at a time never overlaps


def test_a_conversation_goes_on_from_the_previous_run_and_counts_every_turn() -> None:
    def model(request: ModelRequest) -> ModelResponse:
        last = request.messages[-1]
        if isinstance(last, ToolMessage):
            return reply(f"It is {last.content}.")
        country = "Spain" if "Spain" in str(last.content) else "France"
        return reply("", call("lookup", country=country))

    seen: list[int] = []

    def history_kept(ctx: Any) -> bool:
        seen.append(len(ctx.result.messages))
        return ctx.turns == 4

    dataset = Dataset(
        cases=(
            Case(
                name="two",
                input=("Capital of France?", "And Spain?"),
                evaluators=(
                    Contains(text="Madrid"),
                    Called(tools=("lookup",)),
                    Check(function=history_kept),
                ),
            ),
        )
    )
    report = evaluate_sync(agent_of(FunctionModel(model)), dataset)
    trial = report.trials[0]
    assert trial.passed, trial.failures
    assert trial.tools_called == ("lookup", "lookup")
    assert len(trial.run_ids) == 2
    assert seen == [8]  # user, call, result, answer, twice


def test_an_evaluator_that_raises_fails_its_verdict_not_the_eval() -> None:
    def broken(ctx: Any) -> bool:
        raise KeyError("oops")

    dataset = Dataset(
        cases=(Case(name="a", input="Capital of France?"),), evaluators=(Check(function=broken),)
    )
    report = evaluate_sync(agent_of(FunctionModel(lambda r: "Paris")), dataset)
    verdict = report.trials[0].verdicts[0]
    assert (verdict.passed, verdict.reason) == (False, "raised KeyError: 'oops'")


def _looks_up_then_answers(request: ModelRequest) -> ModelResponse:
    if any(isinstance(m, ToolMessage) for m in request.messages) or request.turn > 1:
        return reply("Paris")
    return reply("", call("lookup", country="France"))


def test_the_invariants_catch_a_seeded_broken_run_whatever_its_score(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dataset = Dataset(
        cases=(Case(name="france", input="Capital of France?", expected_output="Paris"),)
    )
    agent = agent_of(FunctionModel(_looks_up_then_answers))
    sound = evaluate_sync(agent, dataset, repeats=2)
    assert sound.overall.passed == 2
    assert sound.broken == 0

    drop_the_last_tool_result(monkeypatch)
    broken = evaluate_sync(agent, dataset, repeats=2)
    for trial in broken.trials:
        assert [v.passed for v in trial.verdicts] == [True]  # the answer is right...
        assert not trial.passed  # ...and the run still fails: it broke a promise
        assert trial.violation is not None
        assert "left unanswered" in trial.violation
    assert (broken.overall.passed, broken.broken) == (0, 2)
    assert "BROKEN: 2 run(s) broke a run invariant" in report_text(broken)
    with pytest.raises(EvalFailure, match="2 run\\(s\\) broke a run invariant"):
        assert_pass_rate(agent, dataset, repeats=2, at_least=0.0)


def test_assert_pass_rate_passes_fails_and_returns_the_report() -> None:
    good = assert_pass_rate(agent_of(coin(3, 1.0)), CAPITAL, repeats=5, at_least=0.9)
    assert isinstance(good, EvalReport)
    assert good.overall.rate == 1.0
    with pytest.raises(EvalFailure) as caught:
        assert_pass_rate(agent_of(coin(3, 0.3)), CAPITAL, repeats=5, at_least=0.9)
    message = str(caught.value)
    assert "is below 0.9" in message
    assert "overall" in message
    assert caught.value.report.overall.rate < 0.9


async def test_assert_pass_rate_works_inside_a_running_event_loop() -> None:
    report = assert_pass_rate(agent_of(coin(5, 1.0)), CAPITAL, repeats=2, at_least=1.0)
    assert report.overall.runs == 4
    direct = await evaluate(agent_of(coin(5, 1.0)), CAPITAL, repeats=2)
    assert direct.overall.passed == 4


def test_a_run_that_raises_is_recorded_as_an_error_and_fails() -> None:
    from tests.custom_tables import once

    def crashes(step: Any) -> None:
        raise RuntimeError("the custom state's work is buggy")

    agent = agent_of(FunctionModel(lambda r: "Paris"), table=once("CHECK", crashes, mark="m"))
    report = evaluate_sync(agent, CAPITAL, repeats=2)
    assert (report.overall.passed, report.overall.errors) == (0, 4)
    trial = report.trials[0]
    assert trial.error is not None
    assert "TableError" in trial.error
    assert "buggy" in trial.error
    assert (trial.status, trial.verdicts) == (None, ())
    assert report.overall.stop_reasons == {"none": 4}
    assert any(line.startswith("error: TableError") for line in report.cases[0].failures)


def test_the_progress_bar_redraws_on_a_terminal_and_logs_tenths_elsewhere() -> None:
    import io

    from agent_fsm.evals import ProgressBar

    live, log = io.StringIO(), io.StringIO()
    bars = [ProgressBar(live, width=10, live=True), ProgressBar(log, width=10, live=False)]
    report = evaluate_sync(
        agent_of(coin(4, 1.0)),
        CAPITAL,
        repeats=10,
        on_trial=lambda record, done, total: [bar(record, done, total) for bar in bars],
    )
    assert report.overall.runs == 20
    assert live.getvalue().count("\r\x1b[2K") == 20
    assert live.getvalue().endswith("[##########] 20/20 passed 20 failed 0 broken 0\n")
    lines = log.getvalue().splitlines()
    assert len(lines) == 11  # 0/10 of the way is never drawn: the first trial is 1/20
    assert lines[0] == "[..........] 1/20 passed 1 failed 0 broken 0"
    assert lines[-1] == "[##########] 20/20 passed 20 failed 0 broken 0"
