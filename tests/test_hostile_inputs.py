"""Hostile inputs, round two (issue 33): histories whose ids do not name one call each,
context policies that lie or write, text that is not UTF-8 in a run's own data, and the
smaller points. Each test fails on the code before the issue."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from agent_fsm import (
    Agent,
    ConfigError,
    KeepLastTurns,
    Limits,
    MemoryStore,
    SQLiteStore,
    StopReason,
    Table,
    tool,
)
from agent_fsm.compaction import Context
from agent_fsm.errors import TableError
from agent_fsm.events import ContextCompacted, Event, HistoryRepaired
from agent_fsm.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from agent_fsm.prompt import ContextEdits
from agent_fsm.run.history import INTERRUPTED
from agent_fsm.testing import ScriptedModel, call, check_invariants, reply
from agent_fsm.testing.invariants import transcript_problems
from agent_fsm.tools import ToolResult
from tests.conftest import echo
from tests.custom_tables import once

# -- history ids -----------------------------------------------------------------------------


def _asked(*calls: ToolCall) -> list[object]:
    return [UserMessage(content="Look these up."), AssistantMessage(content="", tool_calls=calls)]


def _run_from(history: list[object]) -> tuple[object, list[Event], ScriptedModel]:
    events: list[Event] = []
    model = ScriptedModel(["Fine."])
    agent = Agent(model=model, tools=[echo]).subscribe(events.append)
    result = agent.run_sync("And now?", history=history)  # type: ignore[arg-type]
    check_invariants(result, limits=agent.limits, bound=agent.bound)
    return result, events, model


def _ids_and_results(messages: object) -> tuple[list[str], list[tuple[str, str, str]]]:
    calls = [c.id for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls]  # type: ignore[attr-defined]
    results = [
        (m.tool_call_id, m.name, m.content)
        for m in messages  # type: ignore[attr-defined]
        if isinstance(m, ToolMessage)
    ]
    return calls, results


def test_two_calls_with_one_id_get_an_id_each_and_one_result_answers_one() -> None:
    history = [
        *_asked(
            ToolCall(id="a", name="echo", arguments='{"text": "x"}'),
            ToolCall(id="a", name="echo", arguments='{"text": "y"}'),
        ),
        ToolMessage(tool_call_id="a", name="echo", content="x"),
    ]
    result, events, model = _run_from(history)
    calls, results = _ids_and_results(result.messages)  # type: ignore[attr-defined]
    assert calls[0] == "a"
    assert len(set(calls)) == 2
    assert results == [("a", "echo", "x"), (calls[1], "echo", INTERRUPTED)]
    assert transcript_problems(model.requests[0].messages) == []
    (repaired,) = [e for e in events if isinstance(e, HistoryRepaired)]
    assert repaired.ids == (("a", calls[1]),)
    assert repaired.answered == (calls[1],)


def test_an_empty_id_gets_one_and_its_result_follows_it() -> None:
    history = [
        *_asked(ToolCall(id="", name="echo", arguments='{"text": "x"}')),
        ToolMessage(tool_call_id="", name="echo", content="x"),
    ]
    result, events, _ = _run_from(history)
    calls, results = _ids_and_results(result.messages)  # type: ignore[attr-defined]
    assert calls[0]
    assert results == [(calls[0], "echo", "x")]
    (repaired,) = [e for e in events if isinstance(e, HistoryRepaired)]
    assert repaired.ids == (("", calls[0]),)


def test_an_id_an_earlier_call_took_is_given_anew() -> None:
    history = [
        *_asked(ToolCall(id="a", name="echo", arguments='{"text": "x"}')),
        ToolMessage(tool_call_id="a", name="echo", content="x"),
        *_asked(ToolCall(id="a", name="echo", arguments='{"text": "y"}')),
        ToolMessage(tool_call_id="a", name="echo", content="y"),
    ]
    result, _, _ = _run_from(history)
    calls, results = _ids_and_results(result.messages)  # type: ignore[attr-defined]
    assert calls[0] == "a"
    assert calls[1] != "a"
    assert results == [("a", "echo", "x"), (calls[1], "echo", "y")]


def test_a_result_that_names_another_tool_takes_its_calls_name() -> None:
    history = [
        *_asked(
            ToolCall(id="a", name="echo", arguments='{"text": "x"}'),
            ToolCall(id="b", name="lookup", arguments="{}"),
        ),
        ToolMessage(tool_call_id="b", name="lookup", content="found"),
        ToolMessage(tool_call_id="a", name="lookup", content="x"),
    ]
    result, events, _ = _run_from(history)
    _, results = _ids_and_results(result.messages)  # type: ignore[attr-defined]
    assert results == [("a", "echo", "x"), ("b", "lookup", "found")]  # in call order
    (repaired,) = [e for e in events if isinstance(e, HistoryRepaired)]
    assert repaired.names == ("a",)


def test_results_sharing_an_id_pair_with_the_calls_of_their_own_tool() -> None:
    history = [
        *_asked(
            ToolCall(id="a", name="echo", arguments='{"text": "x"}'),
            ToolCall(id="a", name="lookup", arguments="{}"),
        ),
        ToolMessage(tool_call_id="a", name="lookup", content="found"),
        ToolMessage(tool_call_id="a", name="echo", content="x"),
    ]
    result, _, _ = _run_from(history)
    calls, results = _ids_and_results(result.messages)  # type: ignore[attr-defined]
    assert results == [("a", "echo", "x"), (calls[1], "lookup", "found")]


# -- context policies ------------------------------------------------------------------------

BIG = 4_000


@tool
def fetch(page: int) -> ToolResult:
    """Fetch one page of a large document."""
    return ToolResult(output=f"page {page}: " + "x" * BIG)


def _reader(policy: object) -> Agent:
    pages = [reply("", call("fetch", page=p)) for p in range(3)]
    return Agent(
        model=ScriptedModel([*pages, "Done."]),
        tools=[fetch],
        limits=Limits(max_turns=10, token_budget=10**7, reply_tokens=300, context_window=3_000),
        context_policy=[policy, KeepLastTurns(1)],  # type: ignore[list-item]
    )


@dataclass(frozen=True)
class Wiper:
    """A policy that tries to empty the run's transcript."""

    name: str = "wiper"

    def shrink(self, context: Context) -> ContextEdits | None:
        context.messages.clear()  # type: ignore[attr-defined]
        return None


def test_a_policy_cannot_change_the_runs_transcript() -> None:
    events: list[Event] = []
    agent = _reader(Wiper()).subscribe(events.append)
    result = agent.run_sync("Read the document.")
    check_invariants(result, limits=agent.limits, bound=agent.bound, events=events)
    assert result.output == "Done."
    assert len(result.messages) == 8  # the input, three calls and their results, the answer
    problems = [p for e in events if isinstance(e, ContextCompacted) for p in e.problems]
    assert problems
    assert all(p.startswith("wiper failed: AttributeError") for p in problems)


@dataclass(frozen=True)
class DropEverything:
    """A policy that cuts the whole transcript, the latest user input with it."""

    name: str = "drop_everything"

    def shrink(self, context: Context) -> ContextEdits | None:
        return context.edits.model_copy(update={"start": len(context.messages)})


def test_edits_that_would_not_send_the_latest_input_are_refused() -> None:
    events: list[Event] = []
    model_agent = _reader(DropEverything())
    agent = model_agent.subscribe(events.append)
    result = agent.run_sync("Read the document.")
    check_invariants(result, limits=agent.limits, bound=agent.bound, events=events)
    problems = [p for e in events if isinstance(e, ContextCompacted) for p in e.problems]
    assert any("cuts the latest user input" in p for p in problems)
    for request in model_agent.model.requests:  # type: ignore[attr-defined]
        assert UserMessage(content="Read the document.") in request.messages


# -- text that is not UTF-8, in a run's own data ---------------------------------------------


def _noting(value: object) -> Table:
    """A table with a NOTE state whose work writes ``value`` into the notes, once."""

    def note(step: Any) -> None:
        step.notes["f"] = value

    return once("NOTE", note, mark="f")


def test_notes_with_a_lone_surrogate_are_cleaned_on_every_store(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "runs.sqlite3") as store:
        agent = Agent(
            model=ScriptedModel(["Done."]),
            table=_noting(["half \ud83d", {"k": "\udc80"}]),
            store=store,
        )
        result = agent.run_sync("Go.")
        assert result.output == "Done."
        assert store.load(result.run_id).notes == {"f": ["half \ufffd", {"k": "\ufffd"}]}


@pytest.mark.parametrize("value", [{1, 2}, object(), float("nan"), {3: "x"}])
def test_notes_that_are_not_json_are_a_table_error_naming_the_state(value: object) -> None:
    agent = Agent(model=ScriptedModel(["Done."]), table=_noting(value))
    with pytest.raises(TableError, match=r"the work of state NOTE put .*notes\['f'\]"):
        agent.run_sync("Go.")


@pytest.mark.parametrize("bad", ["half \ud83d", "nul\x00", ""])
def test_ids_that_no_store_can_keep_are_refused_up_front(bad: str, tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "runs.sqlite3") as store:
        agent = Agent(model=ScriptedModel(["Done."]), store=store)
        with pytest.raises(ConfigError, match=r"run.id"):
            agent.start("Go.", run_id=bad)
        with pytest.raises(ConfigError, match=r"worker.id"):
            Agent(model=ScriptedModel([]), store=store, lease_s=30, worker_id=bad)
        with pytest.raises(ConfigError, match=r"run.id"):
            agent.reopen(bad)


# -- smaller points --------------------------------------------------------------------------


class Invoice(BaseModel):
    """An invoice."""

    number: str
    total: float


def test_typed_output_is_held_by_output_retries_not_by_consecutive_errors() -> None:
    """Failing final_result arguments are counted by output_retries alone: with the default
    limits the run stops invalid_output, not consecutive_errors at the third failure."""
    bad = [  # four different mistakes, so that no loop is detected either
        reply("", call("final_result", number="F-1")),
        reply("", call("final_result", total=12)),
        reply("", call("final_result", number="F-3", total="twelve")),
        reply("", call("final_result", number=4, total=12)),
        reply("", call("final_result", number="F-5", total=12)),
    ]
    agent = Agent(model=ScriptedModel(bad), output_type=Invoice)
    result = agent.run_sync("Read the invoice.")
    check_invariants(result, limits=agent.limits, bound=agent.bound)
    assert (result.stop_reason, result.turns) == (StopReason.INVALID_OUTPUT, 4)
    assert agent.limits.max_consecutive_errors == 3  # it would have spoken at the third


def test_a_retry_keeps_its_turns_number_in_the_request() -> None:
    model = ScriptedModel([ConnectionError("reset"), "Done."])
    agent = Agent(model=model, limits=Limits(retry_backoff_s=0, retry_backoff_max_s=0))
    result = agent.run_sync("Go.")
    assert (result.turns, result.retries) == (1, 1)
    assert [request.turn for request in model.requests] == [1, 1]


def test_a_models_call_id_with_a_lone_surrogate_is_cleaned_like_its_text() -> None:
    store = MemoryStore()
    model = ScriptedModel(
        [reply("", ToolCall(id="call\ud83d", name="echo", arguments='{"text": "x"}')), "Done."]
    )
    agent = Agent(model=model, tools=[echo], store=store)
    result = agent.run_sync("Go.")
    check_invariants(result, limits=agent.limits, bound=agent.bound)
    (result_message,) = [m for m in result.messages if isinstance(m, ToolMessage)]
    assert result_message.tool_call_id == "call\ufffd"
    assert store.load(result.run_id).messages == list(result.messages)
