"""A judge in the loop: every final answer is judged before the run may end with it.

python examples/judged_answers.py
python examples/judged_answers.py --model gpt-4o-mini [--base-url http://127.0.0.1:8000/v1]

A JUDGE state joins the default loop. A final answer no longer ends the run: it goes through
REFLECT (where every limit is checked) to JUDGE, which asks a judge model for a verdict on
it. ``accept`` ends the run with the answer; ``retry`` gives the agent the judge's hint and
another turn, at most ``MAX_RETRIES`` times; ``stop``, or a retry past the limit, or a verdict
the judge could not give, ends the run as ``rejected``. The judge's call counts a turn
(``counts_turn=True``), so ``max_turns`` bounds every model call, the judge's included, and
the agent's machine proves the loop ends when it is built.

The diagram of this table is committed as ``diagrams/judged_answers.mmd`` (``make diagrams``).
"""

from __future__ import annotations

import argparse
import logging
from typing import Literal

import structlog
from pydantic import BaseModel, ValidationError

from agent_fsm import (
    Agent,
    CustomState,
    Limits,
    Row,
    RunResult,
    StepContext,
    StopReason,
    Table,
    tool,
)
from agent_fsm.messages import FinishReason
from agent_fsm.models import Model
from agent_fsm.state import RunState
from agent_fsm.testing import ScriptedModel, call, reply

MAX_RETRIES = 2
"""Answers the judge may send back with a hint, over the run."""

JUDGE_PROMPT = (
    "You are the judge. Read the conversation above and judge the assistant's last answer. "
    'Reply with JSON only: {"verdict": "accept" | "retry" | "stop", "hint": "..."}: accept a '
    "correct answer; retry, with a one-sentence hint, an answer that can be fixed; stop one "
    "that cannot."
)


class Verdict(BaseModel):
    verdict: Literal["accept", "retry", "stop"]
    hint: str = ""


# -- the guards ------------------------------------------------------------------------------


def answer_awaits_judge(state: RunState, limits: Limits) -> bool:
    """REFLECT was reached with a final answer (not after tool calls, nor with input queued)."""
    return (
        state.last_tool_calls == 0
        and state.last_finish_reason is FinishReason.STOP
        and not state.pending_input
        and not state.follow_ups
    )


def judge_accepted(state: RunState, limits: Limits) -> bool:
    return state.notes.get("verdict") == "accept"


def judge_wants_retry(state: RunState, limits: Limits) -> bool:
    """A retry the judge asked for, within ``MAX_RETRIES``."""
    return state.notes.get("verdict") == "retry" and state.notes.get("retries", 0) <= MAX_RETRIES


# -- the work of JUDGE -----------------------------------------------------------------------


def judging(judge: Model | None) -> CustomState:
    """The JUDGE state, asking ``judge`` (None: the agent's own model)."""

    async def judge_the_answer(step: StepContext) -> None:
        step.notes.pop("verdict", None)
        text = await step.ask(JUDGE_PROMPT, model=judge)
        if text is None:  # the call failed: RunState.model_failure says why
            return
        try:
            verdict = Verdict.model_validate_json(text)
        except ValidationError:
            step.notes["verdict"] = "unreadable"
            return
        step.notes["verdict"] = verdict.verdict
        if verdict.verdict == "retry":
            step.notes["retries"] = step.notes.get("retries", 0) + 1
            if step.notes["retries"] <= MAX_RETRIES:
                step.say(f"A reviewer read your answer: {verdict.hint} Please answer again.")

    return CustomState("JUDGE", trigger="judged", work=judge_the_answer, counts_turn=True)


def judged_table(judge: Model | None = None) -> Table:
    """The default loop with a judge between a final answer and DONE."""
    return (
        Table.default()
        .with_states(judging(judge))
        .with_guards(
            answer_awaits_judge=answer_awaits_judge,
            judge_accepted=judge_accepted,
            judge_wants_retry=judge_wants_retry,
        )
        # THINK: a final answer goes to REFLECT, where the limits are checked, not to DONE.
        .replace(("THINK", "final_answer"), Row("thought", "THINK", "REFLECT", (), "to_judge"))
        # REFLECT, after every limit: judge the answer.
        .insert(
            [Row("reflected", "REFLECT", "JUDGE", ("answer_awaits_judge",), "judge")],
            before=("REFLECT", "continue"),
        )
        .insert(
            [
                Row("judged", "JUDGE", "ERROR", ("abort_requested",), "aborted"),
                Row("judged", "JUDGE", "ERROR", ("model_call_failed",), "model_error"),
                Row("judged", "JUDGE", "DONE", ("judge_accepted",), "final_answer"),
                Row("judged", "JUDGE", "OBSERVE", ("judge_wants_retry",), "retry_with_hint"),
                Row("judged", "JUDGE", "ERROR", (), "rejected"),
            ],
            before=("REFLECT", "aborted"),
        )
    )


TABLE = judged_table()
"""The judged loop, the agent's own model judging (as ``make diagrams`` draws it)."""

# -- an offline demonstration ----------------------------------------------------------------


@tool
def multiply(a: int, b: int) -> int:
    """a times b."""
    return a * b


def build_models(name: str | None, base_url: str | None) -> tuple[Model, Model]:
    """The agent's model and the judge's."""
    if name is None:
        agent = ScriptedModel(
            [
                reply("12 times 13 is 146."),  # wrong: the judge sends it back
                reply("", call("multiply", a=12, b=13)),
                reply("12 times 13 is 156."),
            ]
        )
        judge = ScriptedModel(
            [
                reply('{"verdict": "retry", "hint": "Check the product with the tool."}'),
                reply('{"verdict": "accept"}'),
            ]
        )
        return agent, judge
    from agent_fsm.models import OpenAIChatModel

    return OpenAIChatModel(name, base_url=base_url), OpenAIChatModel(name, base_url=base_url)


def build_agent(model: Model, judge: Model | None) -> Agent:
    return Agent(
        model=model,
        tools=[multiply],
        table=judged_table(judge),
        system_prompt="You answer arithmetic questions; use the multiply tool when unsure.",
        limits=Limits(max_turns=10),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a real model name; omit for the offline script")
    parser.add_argument("--base-url", help="an OpenAI-compatible server")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    model, judge = build_models(args.model, args.base_url)
    agent = build_agent(model, judge)
    result: RunResult = agent.run_sync("What is 12 times 13?")
    path = " -> ".join(entry.label for entry in result.trace)
    print(f"{result.stop_reason.value} after {result.turns} turns: {result.output}")
    print(f"path: {path}\n")
    print(agent.diagram(run=result))
    if args.model is None:
        assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
        assert result.output == "12 times 13 is 156."
        assert [e.label for e in result.trace].count("retry_with_hint") == 1


if __name__ == "__main__":
    main()
