"""One truth (issue 32): the rows decide every transition. Which control request ends a turn
is the order of the REFLECT rows, the summary call and a last answer's compaction are rows of
their own, a crash is recovered through a row, and a typed-output correction has its own
verb. Each test here fails on a table whose rows did not decide."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from agent_fsm import (
    Agent,
    AgentState,
    ClearToolResults,
    ConfigError,
    CustomState,
    Limits,
    ResumeError,
    Row,
    SQLiteStore,
    StopReason,
    Summarize,
    Table,
    tool,
)
from agent_fsm.errors import TableError
from agent_fsm.messages import ToolMessage, ToolStatus
from agent_fsm.state import RUN_STATE_ADAPTER, ControlKind
from agent_fsm.table import TABLE
from agent_fsm.testing import InvariantViolation, ScriptedModel, call, check_invariants, reply
from agent_fsm.tools import ToolResult
from tests.conftest import Recorder
from tests.custom_tables import once

S = AgentState


def _run(agent: Agent, text: str = "Go.") -> Any:
    recorder = Recorder()
    agent = agent.subscribe(recorder)
    result = agent.run_sync(text)
    check_invariants(
        result, limits=agent.limits, bound=agent.bound, events=recorder, rows=agent.machine.rows
    )
    return result


def _moved_above(row: tuple[str, str], above: tuple[str, str]) -> Table:
    """The default table with the REFLECT row ``row`` moved right above ``above``."""
    table = Table.default()
    moved = TABLE[table.row_index(*row)]
    return table.replace(row).insert([moved], before=above)


def _answers(result: Any) -> dict[str, tuple[ToolStatus, str]]:
    return {m.name: (m.status, m.content) for m in result.messages if isinstance(m, ToolMessage)}


# -- priority from the rows ------------------------------------------------------------------

BOTH = reply("", call("ask_user", question="Which city?"), call("finish_task", summary="All done."))


def test_ask_user_outranks_finish_task_in_the_default_table() -> None:
    result = _run(Agent(model=ScriptedModel([BOTH])))
    assert result.stop_reason is StopReason.ASK_USER
    assert (result.output, result.pending.kind) == ("Which city?", ControlKind.ASK_USER)
    answers = _answers(result)
    assert answers["ask_user"][0] is ToolStatus.OK
    assert answers["finish_task"] == (
        ToolStatus.SKIPPED,
        "Skipped: ask_user ended the turn, so this call was not run.",
    )


def test_a_table_that_ranks_finish_task_first_ends_the_turn_with_it() -> None:
    table = _moved_above(("REFLECT", "finish_task"), ("REFLECT", "ask_user"))
    agent = Agent(model=ScriptedModel([BOTH]), table=table)
    assert agent.machine.control_order[:2] == (StopReason.FINISH_TASK, StopReason.ASK_USER)
    result = _run(agent)
    assert result.stop_reason is StopReason.FINISH_TASK
    assert (result.output, result.pending) == ("All done.", None)
    answers = _answers(result)
    # the transcript agrees with the row that fired
    assert answers["finish_task"] == (ToolStatus.OK, "The task is marked as finished.")
    assert answers["ask_user"][0] is ToolStatus.SKIPPED


EFFECTS: list[str] = []


@tool(terminal=True)
def submit(report: str) -> str:
    """Submit the report: it ends the run."""
    EFFECTS.append(f"submit {report}")
    return f"submitted {report}"


@tool(requires_approval=True)
def pay(amount: int) -> str:
    """Pay an amount (a person approves it first)."""
    EFFECTS.append(f"pay {amount}")
    return f"paid {amount}"


BOTH_TOOLS = reply("", call("pay", amount=5), call("submit", report="r1"))


def test_a_terminal_result_outranks_calls_awaiting_approval_in_the_default_table() -> None:
    EFFECTS.clear()
    result = _run(Agent(model=ScriptedModel([BOTH_TOOLS]), tools=[pay, submit]))
    assert result.stop_reason is StopReason.TERMINAL_TOOL
    assert result.output == "submitted r1"
    assert EFFECTS == ["submit r1"]


def test_a_table_that_ranks_approval_first_pauses_before_anything_ends_the_run() -> None:
    EFFECTS.clear()
    table = _moved_above(("REFLECT", "approval_required"), ("REFLECT", "terminal_tool"))
    model = ScriptedModel([BOTH_TOOLS, reply("", call("submit", report="r2"))])
    agent = Agent(model=model, tools=[pay, submit], table=table)
    result = agent.run_sync("Go.")
    check_invariants(result, limits=agent.limits, bound=agent.bound, rows=agent.machine.rows)
    assert result.stop_reason is StopReason.APPROVAL_REQUIRED
    assert result.pending is not None
    assert [c.name for c in result.pending.pending_calls] == ["pay"]
    # the terminal call did not run while a person had yet to decide
    assert EFFECTS == []
    status, text = _answers(result)["submit"]
    assert status is ToolStatus.SKIPPED
    assert "wait for a person's approval" in text
    resumed = agent.resume_sync(result.run_id, approvals=True, pause=result.pending.pause)
    check_invariants(resumed, limits=agent.limits, bound=agent.bound, rows=agent.machine.rows)
    assert resumed.stop_reason is StopReason.TERMINAL_TOOL
    assert EFFECTS == ["pay 5", "submit r2"]


def test_a_control_tool_without_its_row_is_refused_when_the_agent_is_built() -> None:
    without_ask = Table.default().replace(("REFLECT", "ask_user"))
    with pytest.raises(ConfigError, match=r"ask_user need.*'ask_user_called'"):
        Agent(model=ScriptedModel([]), table=without_ask)
    Agent(model=ScriptedModel([]), table=without_ask, control_tools=("finish_task",))
    without_approval = Table.default().replace(("REFLECT", "approval_required"))
    with pytest.raises(ConfigError, match=r"pay need.*'approval_pending'"):
        Agent(model=ScriptedModel([]), tools=[pay], table=without_approval)


# -- no mode without a row -------------------------------------------------------------------

BIG = 4_000


@tool
def fetch(page: int) -> ToolResult:
    """Fetch one page of a large document."""
    return ToolResult(output=f"page {page}: " + "x" * BIG)


def _window(**more: Any) -> Limits:
    settings = {"max_turns": 30, "token_budget": 10**7, "reply_tokens": 300}
    return Limits.model_validate({**settings, "context_window": 3_000, **more})


def test_the_summary_call_is_a_state_of_its_own() -> None:
    pages = [reply("", call("fetch", page=p)) for p in range(5)]
    summaries = ScriptedModel(["Pages 0-2 were all x.", "Pages 0-3 were all x."])
    agent = Agent(
        model=ScriptedModel([*pages, "Done."]),
        tools=[fetch],
        limits=_window(),
        context_policy=Summarize(keep_last_turns=1, model=summaries),
    )
    result = _run(agent)
    assert result.stop_reason is StopReason.FINAL_ANSWER
    path = [(e.source, e.dest, e.label) for e in result.trace]
    assert (S.COMPACT, S.SUMMARISE, "summarise") in path
    assert (S.SUMMARISE, S.OBSERVE, "summarised") in path
    # THINK makes the turns' calls only; SUMMARISE's each count a turn too
    assert not any(e.source is S.THINK and e.dest is S.OBSERVE for e in result.trace)
    calls = sum(1 for e in result.trace if e.dest in (S.THINK, S.SUMMARISE))
    assert calls == result.turns == len(summaries.requests) + 6
    assert "SUMMARISE --> OBSERVE : summarised" in agent.diagram()


def test_a_failed_summary_is_retried_by_the_summarise_rows() -> None:
    pages = [reply("", call("fetch", page=p)) for p in range(3)]
    agent = Agent(
        model=ScriptedModel([*pages, "", "A summary.", "Done."]),
        tools=[fetch],
        limits=_window(retry_backoff_s=0, retry_backoff_max_s=0),
        context_policy=Summarize(keep_last_turns=1),
    )
    result = _run(agent)
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.retries == 1
    assert (S.SUMMARISE, S.SUMMARISE, "retry") in [
        (e.source, e.dest, e.label) for e in result.trace
    ]


@tool
def dump(part: int) -> str:
    """Dump a big part of a log."""
    return f"part {part}\n" + "GET /items 200 3 ms\n" * 300


def test_a_last_answers_prompt_is_shrunk_through_the_compact_rows() -> None:
    model = ScriptedModel([reply("", call("dump", part=1)), "The log is all GETs."])
    agent = Agent(
        model=model,
        tools=[dump],
        limits=_window(max_turns=1, last_answer=True, context_window=1_500, reply_tokens=500),
        context_policy=ClearToolResults(keep_last_turns=0),
    )
    result = _run(agent)
    assert (result.stop_reason, result.output) == (StopReason.MAX_TURNS, "The log is all GETs.")
    assert [(e.source, e.dest, e.label) for e in result.trace][-3:] == [
        (S.REFLECT, S.COMPACT, "compact"),
        (S.COMPACT, S.LAST_ANSWER, "last_answer"),
        (S.LAST_ANSWER, S.ERROR, "max_turns"),
    ]
    assert result.trace[-3].guards == (
        "last_answer_wanted",
        "no_turns_left",
        "prompt_exceeds_window",
    )


class Invoice(BaseModel):
    """An invoice."""

    number: str
    total: float


def test_a_typed_output_correction_has_its_own_verb() -> None:
    agent = Agent(
        model=ScriptedModel(
            ["The total is 12.", reply("", call("final_result", number="F-1", total=12))]
        ),
        output_type=Invoice,
    )
    result = _run(agent)
    assert result.value == Invoice(number="F-1", total=12)
    labels = [(e.source, e.dest, e.label) for e in result.trace]
    assert (S.THINK, S.REFLECT, "correct") in labels
    assert all(label != "follow_up" for _, _, label in labels)


# -- a crash is recovered through a row ------------------------------------------------------


def test_a_crashed_run_restarts_its_step_through_a_row(tmp_path: Path) -> None:
    script = [reply("", call("echo", text="a")), "done"]

    @tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    with SQLiteStore(tmp_path / "runs.sqlite3") as store:
        agent = Agent(model=ScriptedModel(script), tools=[echo], store=store)
        run = agent.start("Go.")

        async def two_steps() -> None:
            await run.step()
            await run.step()

        asyncio.run(two_steps())  # OBSERVE -> THINK -> ACT, then the process "dies"
        crashed = store.load(run.run_id)
        assert crashed.state is S.ACT
        again = agent.replace(model=ScriptedModel(script[1:]))
        result = again.resume_sync(run.run_id)
    restart = result.trace[2]
    assert (restart.trigger, restart.source, restart.dest, restart.label) == (
        "resumed",
        S.ACT,
        S.ACT,
        "restart",
    )
    assert restart.guards == ("stopped_by_crash",)
    assert result.resumed_at == (2,)
    assert result.output == "done"
    check_invariants(result, limits=again.limits, bound=again.bound)


def _noop(step: object) -> None:
    return None


def test_a_custom_state_without_its_crash_row_cannot_be_recovered() -> None:
    wait = CustomState("WAIT", trigger="waited", work=_noop)
    into = Row("observed", "OBSERVE", "WAIT", ("input_waiting",), "wait")
    table = (
        Table.default()
        .with_states(wait)
        .insert([into], before=("OBSERVE", "think"))
        .insert([Row("waited", "WAIT", "ERROR", (), "aborted")], before=("OBSERVE", "aborted"))
    )
    # with_states gave the state its crash row
    assert [r.label for r in table.rows if r.source == "WAIT" and r.resumes] == ["restart"]
    agent = Agent(model=ScriptedModel([]), table=table)
    state = RUN_STATE_ADAPTER.validate_python({"run_id": "r", "state": "WAIT"})
    state.trace.append((table.row_index("OBSERVE", "wait"), 0))
    agent.checkpoints.save(state)
    assert agent.reopen("r").state.state == "WAIT"
    no_restart = table.replace(("WAIT", "restart"))
    refusing = Agent(model=ScriptedModel([]), table=no_restart)
    refusing.checkpoints.save(state)
    with pytest.raises(ResumeError, match="no row of its table restarts that state"):
        refusing.reopen("r")


# -- user code cannot break the proof --------------------------------------------------------


def _with_guard(guard: Any) -> Table:
    """The default table with a REFLECT row of the user's own, guarded by ``guard``."""
    row = Row("reflected", "REFLECT", "DONE", ("users_check",), "reflector_done")
    return (
        Table.default().with_guards(users_check=guard).insert([row], before=("REFLECT", "continue"))
    )


def _echoing(turns: int) -> ScriptedModel:
    return ScriptedModel([reply("", call("echo", text=str(i))) for i in range(turns)])


@tool
def echo(text: str) -> str:
    """Echo the text."""
    return text


def test_a_guard_that_writes_the_run_is_a_table_error_before_the_run_moves() -> None:
    def resets_turns(state: Any, limits: Limits) -> bool:
        state.turns = 0
        return False

    agent = Agent(
        model=_echoing(80),
        tools=[echo],
        limits=Limits(max_turns=3),
        table=_with_guard(resets_turns),
    )
    run = agent.start("Go.")

    async def drive() -> None:
        with pytest.raises(
            TableError,
            match=r"guard 'users_check' raised ReadOnlyStateError: "
            r"RunState.turns is read-only",
        ):
            await run.run()

    asyncio.run(drive())
    assert run.state.turns == 1  # unchanged: the run has not moved past REFLECT
    assert run.state.state is S.REFLECT
    assert len(run.state.trace) == 3


@pytest.mark.parametrize(
    "write",
    [
        lambda state: state.messages.append(state.messages[0]),
        lambda state: state.notes.update(x=1),
        lambda state: state.loop.call_streaks.clear(),
        lambda state: state.pending_input.__setitem__(0, "x"),
        lambda state: setattr(state.usage, "input_tokens", 0),
    ],
)
def test_no_write_reaches_the_run_through_a_guard(write: Any) -> None:
    def writes(state: Any, limits: Limits) -> bool:
        write(state)
        return False

    agent = Agent(model=_echoing(2), tools=[echo], table=_with_guard(writes))
    with pytest.raises(TableError, match="guard 'users_check' raised"):
        agent.run_sync("Go.")


def test_a_guard_reads_the_run_as_it_is() -> None:
    seen: list[tuple[int, str, int, bool]] = []

    def reads(state: Any, limits: Limits) -> bool:
        seen.append((state.turns, state.messages[-1].role, len(state.trace), "x" in state.notes))
        return state.turns >= 2

    agent = Agent(model=_echoing(5), tools=[echo], table=_with_guard(reads))
    result = agent.run_sync("Go.")
    assert result.stop_reason is StopReason.REFLECTOR_DONE
    assert seen == [(1, "tool", 3, False), (2, "tool", 7, False)]


def test_a_reflector_that_writes_the_run_is_logged_and_changes_nothing() -> None:
    def cheats(state: Any) -> bool:
        state.turns = 0
        return True

    agent = Agent(model=_echoing(5), tools=[echo], limits=Limits(max_turns=3), reflector=cheats)
    result = agent.run_sync("Go.")
    assert (result.stop_reason, result.turns) == (StopReason.MAX_TURNS, 3)


def _waiting_table(work: Any) -> Table:
    """OBSERVE -> WAIT (the user's work, which notes "waited") -> THINK, once per run."""
    return once("WAIT", work, mark="waited", abortable=True)


def test_the_deadline_cancels_a_custom_states_work() -> None:
    async def sleeps(step: Any) -> None:
        step.notes["waited"] = True
        await asyncio.sleep(3600)

    agent = Agent(
        model=ScriptedModel(["never asked"]),
        table=_waiting_table(sleeps),
        limits=Limits(timeout_s=0.2),
    )
    result = agent.run_sync("Go.")
    assert result.stop_reason is StopReason.TIMEOUT
    assert result.turns == 0  # THINK was entered, its call never started
    assert [e.label for e in result.trace] == ["wait", "think", "timeout"]
    check_invariants(result, limits=agent.limits, bound=agent.bound, rows=agent.machine.rows)


def test_abort_cancels_a_custom_states_work() -> None:
    started = asyncio.Event()

    async def sleeps(step: Any) -> None:
        step.notes["waited"] = True
        started.set()
        await asyncio.sleep(3600)

    agent = Agent(model=ScriptedModel([]), table=_waiting_table(sleeps))

    async def drive() -> Any:
        run = agent.start("Go.")
        task = asyncio.create_task(run.run())
        await started.wait()
        run.abort("the user closed the tab")
        return await task

    result = asyncio.run(drive())
    assert (result.stop_reason, result.error) == (StopReason.ABORTED, "the user closed the tab")
    assert [e.label for e in result.trace][-2:] == ["wait", "aborted"]


def test_work_that_writes_the_run_is_a_table_error_naming_its_state() -> None:
    def appends_a_call(step: Any) -> None:
        step.notes["waited"] = True
        step.state.messages.append(reply("", call("echo", text="x")).message)

    agent = Agent(model=ScriptedModel([]), tools=[echo], table=_waiting_table(appends_a_call))
    with pytest.raises(TableError, match="the work of state WAIT raised ReadOnlyStateError"):
        agent.run_sync("Go.")


def test_work_that_reaches_the_live_run_another_way_is_caught_after_it() -> None:
    live: list[Any] = []

    def appends_a_call(step: Any) -> None:
        step.notes["waited"] = True
        live[0].state.messages.append(reply("", call("echo", text="x")).message)

    agent = Agent(model=ScriptedModel([]), tools=[echo], table=_waiting_table(appends_a_call))
    run = agent.start("Go.")
    live.append(run)

    async def drive() -> None:
        with pytest.raises(TableError, match="the work of state WAIT changed the run's counts"):
            await run.run()

    asyncio.run(drive())


def test_the_invariants_read_the_control_priority_from_the_table() -> None:
    """A table that tries a check of its own before ask_user may end a turn that asked the
    user with that check: the invariants accept it for that table, and not for the default
    one, where ask_user outranks every stop but an abort."""

    def always(state: Any, limits: Limits) -> bool:
        return True

    row = Row("reflected", "REFLECT", "DONE", ("users_check",), "reflector_done")
    table = (
        Table.default()
        .with_guards(users_check=always)
        .insert([row], before=("REFLECT", "ask_user"))
    )
    agent = Agent(
        model=ScriptedModel([reply("", call("ask_user", question="Which city?"))]), table=table
    )
    result = agent.run_sync("Go.")
    assert result.stop_reason is StopReason.REFLECTOR_DONE
    check_invariants(result, limits=agent.limits, bound=agent.bound, rows=agent.machine.rows)
    with pytest.raises(InvariantViolation, match="ask_user was called but the run stopped"):
        check_invariants(result, limits=agent.limits)
