"""Lighter runs (issue 39, point 1): the records a live run holds share what they can. Every
transcript record with the same fields shares one fields set (``records.share_fields_sets``),
and new runs share their frozen defaults, with nothing a user can see changed: the fields
sets are the ones pydantic gives, copies with updates get their own, and runs stored before
still load."""

from __future__ import annotations

import asyncio
import json
from typing import TypeVar

import pytest
from pydantic import BaseModel, ValidationError

from agent_fsm import Agent, Limits, tool
from agent_fsm.messages import AssistantMessage, ToolCall, ToolMessage, Usage, UserMessage
from agent_fsm.records import share_fields_sets
from agent_fsm.state import RUN_STATE_ADAPTER, SHARED_TURNS, STEP_PAIRS, RunState, step_pair
from agent_fsm.testing import ScriptedModel, call, reply

_R = TypeVar("_R", bound=BaseModel)


@tool
def step(n: int) -> int:
    """Step."""
    return n + 1


def _agent(turns: int) -> Agent:
    script = ScriptedModel([*(reply("", call("step", n=i)) for i in range(turns)), "done"])
    return Agent(model=script, tools=[step], limits=Limits(max_turns=10))


def _ended_state(turns: int = 3) -> RunState:
    async def go() -> RunState:
        run = _agent(turns).start("go")
        assert (await run.run()).output == "done"
        return run.state

    return asyncio.run(go())


def _shared(record: _R) -> _R:
    share_fields_sets((record,))
    return record


def test_records_with_the_same_fields_share_one_set_equal_to_pydantics() -> None:
    first = _shared(ToolCall(id="a", name="step", arguments="{}"))
    second = _shared(ToolCall.model_validate_json('{"id": "b", "name": "x", "arguments": "{}"}'))
    fewer = _shared(ToolCall(id="c", name="step"))
    assert first.model_fields_set == {"id", "name", "arguments"}
    assert first.model_fields_set is second.model_fields_set
    assert fewer.model_fields_set == {"id", "name"}
    assert fewer.model_fields_set is not first.model_fields_set
    assert fewer.model_dump(exclude_unset=True) == {"id": "c", "name": "step"}
    assert first == ToolCall(id="a", name="step", arguments="{}")


def test_a_copy_with_updates_has_a_set_of_its_own_and_leaves_the_shared_one_alone() -> None:
    usage = _shared(Usage(input_tokens=3))
    other = _shared(Usage(input_tokens=5))
    shared = usage.model_fields_set
    assert other.model_fields_set is shared
    updated = usage.model_copy(update={"output_tokens": 2})
    assert updated.model_fields_set == {"input_tokens", "output_tokens"}
    assert shared == {"input_tokens"}  # the other records' set did not change
    assert other.model_dump(exclude_unset=True) == {"input_tokens": 5}
    assert (usage + other).model_fields_set is (other + usage).model_fields_set


def test_assigning_a_field_is_refused_and_the_shared_set_stays_as_it_was() -> None:
    message = _shared(UserMessage(content="hi"))
    with pytest.raises(ValidationError):
        message.content = "changed"
    assert message.model_fields_set == {"content"}
    assert _shared(UserMessage(content="other")).model_fields_set is message.model_fields_set


def test_a_fields_set_given_to_model_construct_that_is_not_a_set_is_kept() -> None:
    given = frozenset({"id", "name"})
    record = _shared(ToolCall.model_construct(_fields_set=given, id="a", name="b"))  # type: ignore[arg-type]
    assert record.model_fields_set is given


def test_the_transcript_records_of_every_run_share_their_sets() -> None:
    transcripts = [_ended_state().messages, _ended_state().messages]
    answers = [m for ms in transcripts for m in ms if isinstance(m, ToolMessage)]
    replies = [m for ms in transcripts for m in ms if isinstance(m, AssistantMessage)]
    calls = [c for m in replies for c in m.tool_calls]
    assert len(answers) == 6
    assert len(calls) == 6
    for kind in (answers, calls):
        assert len({id(record.model_fields_set) for record in kind}) == 1
    users = [m for ms in transcripts for m in ms if isinstance(m, UserMessage)]
    assert users[0].model_fields_set is users[1].model_fields_set
    # the sets pydantic gives the same builds, given as the engine builds them
    assert (
        answers[0].model_fields_set
        == ToolMessage(tool_call_id="c", name="s", content="1").model_fields_set
    )
    every = dict.fromkeys(Usage.model_fields, 0)
    ended = _ended_state()
    assert ended.usage.model_fields_set == Usage.model_validate(every).model_fields_set
    assert ended.usage.model_fields_set is _ended_state().usage.model_fields_set


def test_a_run_state_round_trips_through_json_and_reads_the_form_stored_before() -> None:
    """The stores keep the trace as a list of [row, turn] pairs, as they always did."""
    state = RunState(
        run_id="r",
        messages=[UserMessage(content="go"), AssistantMessage(content="done")],
        trace=[(0, 0), (4, 1)],
    )
    stored = RUN_STATE_ADAPTER.dump_json(state)
    assert json.loads(stored)["trace"] == [[0, 0], [4, 1]]
    older = json.loads(stored)
    older["trace"] = [[0, 0], [4, 1]]  # what a store wrote before the pairs were shared
    back = RUN_STATE_ADAPTER.validate_json(json.dumps(older))
    assert back.trace == state.trace
    assert back.messages == state.messages


def test_new_runs_share_their_frozen_defaults_until_they_replace_them() -> None:
    first, second = RunState(run_id="a"), RunState(run_id="b")
    assert first.usage is second.usage
    assert first.usage == Usage()
    assert first.context is second.context
    assert not first.context.active
    ended = _ended_state()
    assert ended.usage.requests == 4  # a run's own sum replaced the shared zero
    assert first.usage == Usage()  # which no run changed


def test_runs_share_their_trace_pairs_and_keep_the_same_trace() -> None:
    """Each transition adds a reference to one (row, turn) tuple of the process, not a tuple
    of its own (``state.step_pair``): the trace, its JSON and its result are unchanged."""
    first, second = _ended_state(), _ended_state()
    assert first.trace == second.trace
    assert all(a is b for a, b in zip(first.trace, second.trace, strict=True))
    assert all(pair is STEP_PAIRS[pair[0]][pair[1]] for pair in first.trace)
    assert all(type(pair) is tuple and len(pair) == 2 for pair in first.trace)
    dumped = json.loads(RUN_STATE_ADAPTER.dump_json(first))
    assert dumped["trace"] == [[row, turn] for row, turn in first.trace]
    assert RUN_STATE_ADAPTER.validate_json(json.dumps(dumped)).trace == first.trace


def test_a_pair_past_the_shared_turns_or_of_no_row_is_a_tuple_of_its_own() -> None:
    assert step_pair(3, 5) == (3, 5)
    assert step_pair(3, 5) is step_pair(3, 5)
    assert step_pair(3, SHARED_TURNS) == (3, SHARED_TURNS)
    assert step_pair(3, SHARED_TURNS) is not step_pair(3, SHARED_TURNS)
    assert step_pair(-1, 0) == (-1, 0)
    assert -1 not in STEP_PAIRS  # "no row" (-1) makes no shared pairs
