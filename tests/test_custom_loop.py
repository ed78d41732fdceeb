"""A loop of your own (issue 19): custom guards, rows and states, verified and run.

The two worked examples (``examples/plan_execute.py``, ``examples/judged_answers.py``) are
loaded as modules and driven here: their tables are verified, their runs checkpointed,
resumed and traced, and the property harness proves they terminate. Seeded bugs show what
is refused at construction (a cycle that skips the turn gate) and what the harness finds at
run time (a guard that raises on some runs).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import settings

from agent_fsm import (
    Agent,
    AgentState,
    CheckpointStore,
    CustomState,
    Limits,
    Row,
    RunStatus,
    SQLiteStore,
    StepContext,
    StopReason,
    Table,
)
from agent_fsm.diagrams import render
from agent_fsm.durable.tracefile import TraceWriter, read_run
from agent_fsm.errors import ConfigError, ResumeError, TableError
from agent_fsm.events import ModelRequested, ModelResponded, StateChanged
from agent_fsm.loop.machine import AgentMachine, with_builtin_guards
from agent_fsm.messages import ModelRequest
from agent_fsm.state import RunState
from agent_fsm.table import TABLE
from agent_fsm.testing import (
    FunctionModel,
    HarnessFailure,
    ScriptedModel,
    assert_terminates,
    call,
    reply,
)
from agent_fsm.testing.invariants import check_invariants
from agent_fsm.testing.strategies import cooperative_behaviours_for
from tests.conftest import Recorder, limits

ROOT = Path(__file__).resolve().parent.parent


def _example(name: str) -> ModuleType:
    """An example script, imported as a module (its ``main`` is not run)."""
    spec = importlib.util.spec_from_file_location(
        f"example_{name}", ROOT / "examples" / f"{name}.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the module's annotations there
    spec.loader.exec_module(module)
    return module


PLAN = _example("plan_execute")
JUDGED = _example("judged_answers")


def _machine(table: Table) -> AgentMachine:
    return AgentMachine(table.rows, with_builtin_guards(table.guards), table.states)


def _never(state: RunState, limits: Limits) -> bool:
    return False


def _nothing(step: StepContext) -> None:
    return None


# -- building a table ------------------------------------------------------------------------


def test_rows_name_states_triggers_and_outcomes_by_text() -> None:
    row = Row("observed", "OBSERVE", "PLAN", ("plan_needed",), "plan")
    assert row.source is AgentState.OBSERVE
    assert row.dest == "PLAN"
    assert row.label == "plan"
    assert (
        Row("thought", "THINK", "DONE", (), "final_answer").stop_reason is StopReason.FINAL_ANSWER
    )


def test_insert_and_replace_find_one_row_by_source_and_label() -> None:
    table = Table.default()
    at = table.row_index("REFLECT", "continue")
    assert TABLE[at].label == "continue"
    extra = Row("reflected", "REFLECT", "DONE", ("reflector_says_done",), "reflector_done")
    assert table.insert([extra], before=("REFLECT", "continue")).rows[at] is extra
    assert len(table.replace(("REFLECT", "continue")).rows) == len(TABLE) - 1
    with pytest.raises(ConfigError, match=r"2 rows from THINK are labelled 'model_error'"):
        table.row_index("THINK", "model_error")
    with pytest.raises(ConfigError, match=r"labels of rows from THINK: \['aborted', 'act'"):
        table.row_index("THINK", "abort")


def test_a_custom_state_must_not_take_a_default_name() -> None:
    with pytest.raises(ConfigError, match="THINK is a state of the default loop"):
        CustomState("THINK", trigger="x", work=_nothing)
    with pytest.raises(ConfigError, match="thought is a trigger of the default loop"):
        CustomState("X", trigger="thought", work=_nothing)
    with pytest.raises(ConfigError, match="needs a name"):
        CustomState("", trigger="x", work=_nothing)


def test_a_custom_guard_may_not_take_a_built_in_name() -> None:
    with pytest.raises(ConfigError, match=r"\['no_turns_left'\] are built in"):
        Agent(model=ScriptedModel([]), table=Table.default().with_guards(no_turns_left=_never))


def test_rows_must_name_known_states_and_states_need_rows() -> None:
    stray = Table.default().insert(
        [Row("observed", "OBSERVE", "NOWHERE", ("abort_requested",), "go")],
        before=("OBSERVE", "think"),
    )
    with pytest.raises(ConfigError, match="names state NOWHERE"):
        _machine(stray)
    idle = Table.default().with_states(CustomState("IDLE", trigger="idled", work=_nothing))
    with pytest.raises(ConfigError, match="state IDLE has no way out"):
        _machine(idle)
    wrong = PLAN.TABLE.replace(("PLAN", "think"), Row("thought", "PLAN", "THINK", (), "think"))
    with pytest.raises(ConfigError, match="state PLAN is left only by trigger plan_asked"):
        _machine(wrong)


# -- the proof, on custom tables --------------------------------------------------------------


def test_the_examples_verify_and_their_bounds_count_every_model_call() -> None:
    plan = Agent(model=ScriptedModel([]), table=PLAN.TABLE, limits=Limits(max_turns=10))
    judged = Agent(model=ScriptedModel([]), table=JUDGED.TABLE, limits=Limits(max_turns=10))
    assert plan._config.machine.counting == {AgentState.THINK, AgentState.SUMMARISE}
    assert judged._config.machine.counting == {AgentState.THINK, AgentState.SUMMARISE, "JUDGE"}
    for agent in (plan, judged):
        assert agent.bound.model_calls == 10 + agent.limits.model_retries_per_run


def test_a_cycle_that_skips_the_turn_gate_is_refused_and_named() -> None:
    """EXECUTE straight back to THINK: a plan reply would start another call with no check of
    the turn budget between the two."""
    skipping = PLAN.TABLE.replace(
        ("EXECUTE", "execute"), Row("plan_filed", "EXECUTE", "THINK", (), "think")
    )
    with pytest.raises(ConfigError, match=r"cycle THINK -> EXECUTE -> THINK skips the turn gate"):
        Agent(model=ScriptedModel([]), table=skipping)


def test_a_row_into_a_state_that_counts_a_turn_must_pass_the_turn_gate() -> None:
    """JUDGE makes a model call; reached from THINK directly, no turn-budget row stands
    between two calls."""
    direct = JUDGED.TABLE.replace(
        ("THINK", "to_judge"), Row("thought", "THINK", "JUDGE", (), "to_judge")
    )
    with pytest.raises(ConfigError, match=r"cycle THINK -> JUDGE skips the turn gate"):
        _machine(direct)


def test_a_cycle_without_a_model_call_is_refused_and_named() -> None:
    replan_at_once = PLAN.TABLE.replace(
        ("PLAN", "think"), Row("plan_asked", "PLAN", "OBSERVE", (), "observe")
    )
    with pytest.raises(ConfigError, match=r"cycle OBSERVE -> PLAN -> OBSERVE makes no model call"):
        _machine(replan_at_once)


# -- running the examples ----------------------------------------------------------------------


def test_plan_then_execute_plans_once_then_replans_when_a_turn_fails(recorder: Recorder) -> None:
    agent = PLAN.build_agent(PLAN.build_model(None, None)).subscribe(recorder)
    result = agent.run_sync("What do apples and pears cost together?")
    assert result.status is RunStatus.COMPLETED
    labels = [entry.label for entry in result.trace]
    assert labels.count("plan") == 1
    assert labels.count("replan") == 1
    prompts = [m.content for m in result.messages if m.role == "user"]
    assert prompts[1:] == [
        PLAN.PLAN_PROMPT,
        PLAN.EXECUTE_PROMPT,
        PLAN.REPLAN_PROMPT,
        PLAN.EXECUTE_PROMPT,
    ]
    changed = [e for e in recorder if isinstance(e, StateChanged)]
    assert [(str(e.source), str(e.dest)) for e in changed][:3] == [
        ("OBSERVE", "PLAN"),
        ("PLAN", "THINK"),
        ("THINK", "EXECUTE"),
    ]


def test_replans_are_bounded_by_their_limit() -> None:
    """Every tool call fails: the run replans MAX_REPLANS times, then goes on without
    replanning until the consecutive-error limit stops it."""

    def model(request: ModelRequest) -> Any:
        last = request.messages[-1]
        turn = len(request.messages)  # varied, so that loop detection stays out of it
        if last.role == "user" and "numbered plan" in last.content:
            return f"1. Try durian number {turn}."
        return reply("", call("price", item=f"durian {turn}"))

    agent = PLAN.build_agent(FunctionModel(model)).replace(
        limits=limits(max_turns=30, max_consecutive_errors=30)
    )
    result = agent.run_sync("Price a durian.")
    labels = [entry.label for entry in result.trace]
    assert labels.count("replan") == PLAN.MAX_REPLANS
    assert result.stop_reason is StopReason.MAX_TURNS


def test_a_judge_that_always_asks_again_is_stopped_by_its_retry_limit() -> None:
    judge = FunctionModel(lambda request: '{"verdict": "retry", "hint": "Try harder."}')
    answers = FunctionModel(lambda request: f"{len(request.messages)} is my answer")
    agent = JUDGED.build_agent(answers, judge)
    result = agent.run_sync("What is 6 times 7?")
    assert result.stop_reason is StopReason.REJECTED
    assert result.status is RunStatus.FAILED
    assert len(judge.requests) == JUDGED.MAX_RETRIES + 1
    hints = [m for m in result.messages if m.role == "user" and "reviewer" in m.content]
    assert len(hints) == JUDGED.MAX_RETRIES
    assert result.turns == 2 * (JUDGED.MAX_RETRIES + 1)  # the judge's calls are turns


def test_the_judges_call_is_aside_from_the_transcript_and_paid_for(recorder: Recorder) -> None:
    judge = FunctionModel(lambda request: reply('{"verdict": "accept"}', usage=(100, 5)))
    agent = JUDGED.build_agent(FunctionModel(lambda request: reply("42", usage=(10, 1))), judge)
    result = agent.subscribe(recorder).run_sync("What is 6 times 7?")
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.output == "42"
    assert [m.role for m in result.messages] == ["system", "user", "assistant"]
    (asked,) = judge.requests
    assert asked.tools == ()
    assert asked.messages[-1].content == JUDGED.JUDGE_PROMPT
    assert asked.messages[-2].content == "42"  # the transcript as the model sees it
    assert result.usage.input_tokens == 110
    assert result.usage.requests == 2
    assert [e.turn for e in recorder if isinstance(e, ModelRequested | ModelResponded)] == [
        1,
        1,
        2,
        2,
    ]


@pytest.mark.parametrize(
    ("judge_says", "stop"),
    [
        (RuntimeError("judge offline"), StopReason.MODEL_ERROR),
        ("I think it is fine", StopReason.REJECTED),  # not a verdict
        ('{"verdict": "stop"}', StopReason.REJECTED),
    ],
)
def test_a_judge_that_fails_or_says_no_ends_the_run(judge_says: object, stop: StopReason) -> None:
    def judge_fn(request: ModelRequest) -> str:
        if isinstance(judge_says, Exception):
            raise judge_says
        return str(judge_says)

    agent = JUDGED.build_agent(FunctionModel(lambda request: "42"), FunctionModel(judge_fn))
    result = agent.run_sync("What is 6 times 7?")
    assert result.stop_reason is stop
    check_invariants(result, limits=agent.limits, bound=agent.bound, rows=agent.table.rows)


def test_an_abort_during_the_judges_call_cancels_it_and_ends_the_run() -> None:
    async def slow_judge(request: ModelRequest) -> str:
        await asyncio.sleep(60)
        return '{"verdict": "accept"}'

    agent = JUDGED.build_agent(FunctionModel(lambda request: "42"), FunctionModel(slow_judge))

    async def main() -> Any:
        run = agent.start("What is 6 times 7?")
        while run.state.state != "JUDGE":
            await run.step()
        judging = asyncio.ensure_future(run.step())
        await asyncio.sleep(0.01)
        run.abort("enough")
        await judging
        return await run.run()

    result = asyncio.run(main())
    assert result.stop_reason is StopReason.ABORTED
    assert result.trace[-1].source == "JUDGE"


# -- the contract of the user's code -------------------------------------------------------------


def _one_state_table(work: Any, *, counts_turn: bool = False) -> Table:
    """OBSERVE goes through STEP (doing ``work``) before the first THINK: straight on to
    THINK, or, when STEP makes a model call itself, back to OBSERVE (no two calls without
    the turn gate between them)."""
    after = "OBSERVE" if counts_turn else "THINK"
    return (
        Table.default()
        .with_states(CustomState("STEP", trigger="stepped", work=work, counts_turn=counts_turn))
        .with_guards(first_step=lambda state, limits: "done" not in state.notes)
        .insert(
            [Row("observed", "OBSERVE", "STEP", ("first_step",), "step")],
            before=("OBSERVE", "think"),
        )
        .insert(
            [
                Row("stepped", "STEP", "ERROR", ("model_call_failed",), "model_error"),
                Row("stepped", "STEP", after, (), "on"),
            ],
            before=("OBSERVE", "aborted"),
        )
    )


def _run_with(table: Table, *script: Any) -> Any:
    agent = Agent(model=ScriptedModel(list(script)), table=table, limits=limits())
    return agent.run_sync("go")


def test_asking_the_model_is_only_for_a_state_that_counts_a_turn() -> None:
    async def asks(step: StepContext) -> None:
        step.notes["done"] = True
        step.notes["said"] = await step.ask("Say something.")

    with pytest.raises(TableError, match="only a state that counts_turn may"):
        _run_with(_one_state_table(asks), "fine")
    agent = Agent(
        model=ScriptedModel(["aside", "fine"]),
        table=_one_state_table(asks, counts_turn=True),
        limits=limits(),
    )
    result = agent.run_sync("go")
    assert result.turns == 2
    assert result.output == "fine"
    assert [m.content for m in result.messages if m.role == "assistant"] == ["fine"]


def test_asking_twice_in_one_turn_is_refused() -> None:
    async def asks_twice(step: StepContext) -> None:
        step.notes["done"] = True
        await step.ask("One.")
        await step.ask("Two.")

    with pytest.raises(TableError, match="asked the model twice in one turn"):
        _run_with(_one_state_table(asks_twice, counts_turn=True), "one", "two")


def test_a_state_whose_work_raises_stops_the_driver_with_a_table_error() -> None:
    def broken(step: StepContext) -> None:
        raise KeyError("plan")

    with pytest.raises(
        TableError, match=r"the work of state STEP raised KeyError: 'plan'"
    ) as caught:
        _run_with(_one_state_table(broken), "fine")
    assert isinstance(caught.value.__cause__, KeyError)


def test_saying_a_message_between_a_call_and_its_result_is_refused() -> None:
    def says(step: StepContext) -> None:
        step.say("hello")

    table = (
        Table.default()
        .with_states(CustomState("SAY", trigger="said", work=says))
        .replace(("THINK", "act"), Row("thought", "THINK", "SAY", ("reply_has_tool_calls",), "say"))
        .insert([Row("said", "SAY", "ACT", (), "act")], before=("ACT", "reflect"))
    )
    with pytest.raises(TableError, match="wait for their results: route the run through ACT"):
        _run_with(table, reply("", call("echo", text="x")), "done")


@pytest.mark.parametrize(
    ("guard", "match"),
    [
        (lambda state, limits: state.notes["missing"], r"guard 'odd' raised KeyError"),
        (lambda state, limits: "yes", r"guard 'odd' returned str, not a bool"),
    ],
)
def test_a_guard_that_breaks_the_contract_is_named(guard: Any, match: str) -> None:
    table = (
        Table.default()
        .with_guards(odd=guard)
        .insert(
            [Row("reflected", "REFLECT", "DONE", ("odd",), "reflector_done")],
            before=("REFLECT", "continue"),
        )
    )
    with pytest.raises(TableError, match=match):
        _run_with(table, reply("", call("echo", text="x")), "done")


# -- checkpoints, resume, traces, diagrams ------------------------------------------------------


def test_a_run_stopped_in_a_custom_state_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """A worker dies right after EXECUTE's work was checkpointed; another agent with the same
    table carries the run on from the store, and it ends as an uninterrupted run does."""
    path = tmp_path / "runs.sqlite3"

    async def until_execute() -> str:
        with SQLiteStore(path) as store:
            agent = PLAN.build_agent(PLAN.build_model(None, None)).replace(store=store)
            run = agent.start("What do apples and pears cost together?")
            while run.state.state != "EXECUTE":
                await run.step()
            (summary,) = store.list_runs()
            assert summary.state == "EXECUTE"
            return run.run_id

    run_id = asyncio.run(until_execute())
    with SQLiteStore(path) as store:
        assert store.load(run_id).state == "EXECUTE"
        assert store.load(run_id).notes["phase"] == "planning"  # EXECUTE's work not done yet
        with pytest.raises(
            ResumeError, match=r"was made by a different agent: .*its table differs"
        ):
            Agent(model=ScriptedModel([]), store=store).resume_sync(run_id)
        rest = ScriptedModel(PLAN.OFFLINE_SCRIPT[1:])  # the plan was written before the crash
        result = PLAN.build_agent(rest).replace(store=store).resume_sync(run_id)
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.output == "Apples and pears cost 7 euros together."
    assert json.loads(json.dumps(result.model_dump(mode="json")))["final_state"] == "DONE"


def test_every_store_keeps_a_custom_state_and_its_notes(store: CheckpointStore) -> None:
    """Memory, SQLite and PostgreSQL: a run saved in a custom state loads back in it (a
    name, where a state of the default loop loads as its enum member), with its notes."""
    state = RunState(run_id="custom", state="EXECUTE", notes={"phase": "planning", "plans": 1})
    state.trace.append((0, 0))
    store.save(state)
    loaded = store.load("custom")
    assert loaded.state == "EXECUTE"
    assert loaded.notes == {"phase": "planning", "plans": 1}
    (summary,) = store.list_runs()
    assert summary.state == "EXECUTE"
    loaded.state = AgentState.THINK
    store.save(loaded)
    assert store.load("custom").state is AgentState.THINK


def test_a_trace_file_of_a_custom_run_draws_its_path(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with TraceWriter(path) as writer:
        agent = JUDGED.build_agent(*JUDGED.build_models(None, None)).subscribe(writer)
        result = agent.run_sync("What is 12 times 13?")
    recorded = read_run(path)
    assert [(e.source, e.dest, e.label) for e in recorded.trace] == [
        (e.source, e.dest, e.label) for e in result.trace
    ]
    drawn = render(JUDGED.TABLE.rows, "mermaid", run=recorded)
    assert "JUDGE --> OBSERVE : judged #4 [judge_wants_retry] retry_with_hint ×1" in drawn
    assert "class OBSERVE, THINK, ACT, REFLECT, JUDGE visited" in drawn


@pytest.mark.parametrize("name", ["plan_execute", "judged_answers"])
def test_the_committed_diagram_of_each_example_matches_its_table(name: str) -> None:
    committed = (ROOT / "diagrams" / f"{name}.mmd").read_text()
    table = _example(name).TABLE
    assert committed == render(table.rows, "mermaid"), "run `make diagrams` and commit the result"


# -- the property harness, unchanged, on custom tables ---------------------------------------


@pytest.mark.parametrize("cooperative", [False, True], ids=["misbehaving", "cooperative"])
def test_the_harness_proves_plan_then_execute_terminates(cooperative: bool) -> None:
    """The default behaviours (most runs meet failures) and cooperative ones (most runs
    plan, execute and replan) both."""
    agent = PLAN.build_agent(ScriptedModel([]))
    behaviours = cooperative_behaviours_for(agent) if cooperative else None
    assert_terminates(agent, behaviours=behaviours, max_examples=60)


def _verdict_of(request: ModelRequest) -> str:
    """A judge decided by what the harness made the agent say: every verdict shows up."""
    seen = sum(len(m.content) for m in request.messages)
    verdicts = [
        '{"verdict": "accept"}',
        '{"verdict": "retry", "hint": "Again."}',
        '{"verdict": "stop"}',
        "not a verdict",
    ]
    return verdicts[seen % len(verdicts)]


@pytest.mark.parametrize("cooperative", [False, True], ids=["misbehaving", "cooperative"])
def test_the_harness_proves_a_judged_loop_terminates(cooperative: bool) -> None:
    agent = JUDGED.build_agent(ScriptedModel([]), FunctionModel(_verdict_of))
    behaviours = cooperative_behaviours_for(agent) if cooperative else None
    assert_terminates(agent, behaviours=behaviours, max_examples=60)


def test_the_harness_finds_a_guard_that_breaks_only_on_some_runs() -> None:
    """A judge guard that assumes a retry was counted before: fine while the judge accepts
    (an earlier row decides) or asks for a retry, a KeyError once it says "stop", which this
    judge does to any answer: the runs that reach a final answer break it, the others (tool
    errors, limits) never show it. The table verifies; the harness finds the runs."""

    def judge_wants_retry(state: RunState, limits: Limits) -> bool:
        return state.notes["retries"] <= 2 and state.notes.get("verdict") == "retry"

    table = JUDGED.judged_table(FunctionModel(lambda request: '{"verdict": "stop"}'))
    guards = {**table.guards, "judge_wants_retry": judge_wants_retry}
    agent = JUDGED.build_agent(ScriptedModel([]), None).replace(
        table=Table(table.rows, table.states, guards)
    )
    with pytest.raises(HarnessFailure, match=r"guard 'judge_wants_retry' raised KeyError"):
        assert_terminates(
            agent,
            behaviours=cooperative_behaviours_for(agent),
            settings=settings(derandomize=True),
            max_examples=100,
        )


def test_the_harness_finds_work_that_would_let_a_run_go_on_forever() -> None:
    """A replan that "gives its turn back": the turn count, which the turn budget reads,
    would never reach max_turns on a run that keeps replanning. Only runs that replan show
    it; the harness finds them, and the engine names the state."""

    def generous_replan(step: StepContext) -> None:
        PLAN.ask_for_plan(step)
        if step.notes["plans"] > 1:
            step.state.turns -= 1

    table = PLAN.TABLE
    states = tuple(
        CustomState("PLAN", trigger="plan_asked", work=generous_replan) if s.name == "PLAN" else s
        for s in table.states
    )
    agent = PLAN.build_agent(ScriptedModel([])).replace(
        table=Table(table.rows, states, table.guards)
    )
    with pytest.raises(
        HarnessFailure,
        match=r"the work of state PLAN raised ReadOnlyStateError: RunState.turns is read-only",
    ):
        assert_terminates(
            agent,
            behaviours=cooperative_behaviours_for(agent),
            settings=settings(derandomize=True),
            max_examples=200,
            real_tools=True,  # the price lookup is pure, and its failures make runs replan
        )
