"""Plan, then execute: a loop of your own, still proven to end.

python examples/plan_execute.py
python examples/plan_execute.py --model gpt-4o-mini [--base-url http://127.0.0.1:8000/v1]

Two states join the default loop. PLAN asks the model for a plan before the work starts;
EXECUTE files the plan the model wrote and asks it to carry the plan out. When a turn's tool
calls all fail, a replan row takes the run back to PLAN, at most ``MAX_REPLANS`` times. Every
model call is still a THINK turn, so ``max_turns`` bounds the run: the agent's machine checks
that when it is built (a table where a cycle skips the turn gate is refused, naming it).

The diagram of this table is committed as ``diagrams/plan_execute.mmd`` (``make diagrams``).
"""

from __future__ import annotations

import argparse
import logging

import structlog

from agent_fsm import (
    Agent,
    CustomState,
    Limits,
    Row,
    RunResult,
    RunStatus,
    StepContext,
    Table,
    tool,
)
from agent_fsm.models import Model
from agent_fsm.state import RunState
from agent_fsm.testing import ScriptedModel, call, reply

MAX_REPLANS = 2
"""Plans the run may make after its first one."""

PLAN_PROMPT = (
    "Before you do anything, write a short numbered plan for the task. Do not call tools yet."
)
REPLAN_PROMPT = (
    "The last steps failed. Write a new short numbered plan that avoids what failed. Do not "
    "call tools yet."
)
EXECUTE_PROMPT = "Now carry out the plan, step by step, with the tools. Then answer."


# -- the guards: pure functions of the run state, reading the notes the states keep ---------


def plan_needed(state: RunState, limits: Limits) -> bool:
    """No plan has been asked for yet (read in OBSERVE)."""
    return "phase" not in state.notes


def plan_written(state: RunState, limits: Limits) -> bool:
    """The reply just taken is the plan that was asked for: text, while planning."""
    return state.notes.get("phase") == "planning" and state.last_tool_calls == 0


def replan_wanted(state: RunState, limits: Limits) -> bool:
    """The turn's tool calls all failed, while executing, and a replan is left."""
    return (
        state.notes.get("phase") == "executing"
        and state.consecutive_errors > 0
        and state.notes.get("plans", 0) <= MAX_REPLANS
    )


# -- the work of the two new states ---------------------------------------------------------


def ask_for_plan(step: StepContext) -> None:
    """PLAN: ask for a plan (a new one, after the first), and count it."""
    plans = step.notes.get("plans", 0)
    step.notes["plans"] = plans + 1
    step.notes["phase"] = "planning"
    step.say(REPLAN_PROMPT if plans else PLAN_PROMPT)


def start_executing(step: StepContext) -> None:
    """EXECUTE: keep the plan the model wrote, and ask for it to be carried out."""
    step.notes["plan"] = step.state.output
    step.notes["phase"] = "executing"
    step.say(EXECUTE_PROMPT)


TABLE = (
    Table.default()
    .with_states(
        CustomState("PLAN", trigger="plan_asked", work=ask_for_plan),
        CustomState("EXECUTE", trigger="plan_filed", work=start_executing),
    )
    .with_guards(
        plan_needed=plan_needed, plan_written=plan_written, replan_wanted=replan_wanted
    )
    # OBSERVE, once its limits have passed: plan first, when no plan was asked for yet.
    .insert(
        [Row("observed", "OBSERVE", "PLAN", ("plan_needed",), "plan")],
        before=("OBSERVE", "think"),
    )
    # THINK: a text reply while planning is the plan (tool calls still go to ACT first).
    .insert(
        [Row("thought", "THINK", "EXECUTE", ("plan_written",), "file_plan")],
        before=("THINK", "follow_up"),
    )
    # REFLECT, after every limit: the turn's calls all failed, so plan again.
    .insert(
        [Row("reflected", "REFLECT", "PLAN", ("replan_wanted",), "replan")],
        before=("REFLECT", "continue"),
    )
    .insert(
        [
            Row("plan_asked", "PLAN", "ERROR", ("abort_requested",), "aborted"),
            Row("plan_asked", "PLAN", "THINK", (), "think"),
            Row("plan_filed", "EXECUTE", "ERROR", ("abort_requested",), "aborted"),
            Row("plan_filed", "EXECUTE", "OBSERVE", (), "execute"),
        ],
        before=("THINK", "aborted"),
    )
)  # fmt: skip
"""The plan-then-execute loop: the default rows, two states, three guards and eight rows."""

# -- an offline demonstration ----------------------------------------------------------------

_PRICES = {"apples": 3, "pears": 4}


@tool
def price(item: str) -> int:
    """The price of one item, in euros (apples and pears)."""
    if item not in _PRICES:
        raise ValueError(f"no price for {item!r}; known: {sorted(_PRICES)}")
    return _PRICES[item]


OFFLINE_SCRIPT = [
    reply("1. Price the fruit basket. 2. Add the prices up."),
    reply("", call("price", item="fruit basket")),  # fails: no such item
    reply("1. Price apples. 2. Price pears. 3. Add them up."),  # the replan
    reply("", call("price", item="apples"), call("price", item="pears")),
    reply("Apples and pears cost 7 euros together."),
]
"""What the model says offline, reply by reply."""


def build_model(name: str | None, base_url: str | None) -> Model:
    if name is None:
        return ScriptedModel(OFFLINE_SCRIPT)
    from agent_fsm.models import OpenAIChatModel

    return OpenAIChatModel(name, base_url=base_url)


def build_agent(model: Model) -> Agent:
    return Agent(
        model=model,
        tools=[price],
        table=TABLE,
        system_prompt="You price fruit with the price tool.",
        limits=Limits(max_turns=10, max_consecutive_errors=3),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a real model name; omit for the offline script")
    parser.add_argument("--base-url", help="an OpenAI-compatible server")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    agent = build_agent(build_model(args.model, args.base_url))
    print(f"bound: {agent.bound.formula} transitions")
    result: RunResult = agent.run_sync("What do apples and pears cost together?")
    path = " -> ".join(entry.label for entry in result.trace)
    print(f"{result.stop_reason.value} after {result.turns} turns: {result.output}")
    print(f"path: {path}\n")
    print(agent.diagram(run=result))
    if args.model is None:
        assert result.status is RunStatus.COMPLETED, result.error
        assert [e.label for e in result.trace].count("replan") == 1
        assert result.output == "Apples and pears cost 7 euros together."


if __name__ == "__main__":
    main()
