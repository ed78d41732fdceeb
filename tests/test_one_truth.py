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
from agent_fsm.messages import ToolMessage, ToolStatus
from agent_fsm.state import RUN_STATE_ADAPTER, ControlKind
from agent_fsm.table import TABLE
from agent_fsm.testing import ScriptedModel, call, check_invariants, reply
from agent_fsm.tools import ToolResult
from tests.conftest import Recorder

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
    resumed = agent.resume_sync(result.run_id, approvals=True)
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
