"""``RunResult.trace`` (issue 39): the transitions of a run as a ``Trace``, kept as the run
keeps them (row numbers and turns over the table) and built into ``TraceEntry`` records only
when read; to every reader it is the tuple of its entries."""

from __future__ import annotations

import asyncio
import copy
import pickle

from agent_fsm import Agent, AgentState, Limits, StopReason
from agent_fsm.state import RunResult, Trace, TraceEntry
from agent_fsm.table import TABLE
from agent_fsm.testing import ScriptedModel, call, reply
from tests.conftest import echo


def finished() -> RunResult:
    script = [reply("", call("echo", text="a")), reply("", call("echo", text="b")), "done"]
    agent = Agent(model=ScriptedModel(script), tools=[echo], limits=Limits(max_turns=5))
    result = asyncio.run(agent.run("go"))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    return result


def test_the_trace_is_the_rows_the_run_took_with_their_turns() -> None:
    result = finished()
    trace = result.trace
    assert isinstance(trace, Trace)
    assert len(trace) == 10  # 4 per tool turn, 2 for the answer: in, and out to DONE
    entries = list(trace)
    taken = next(row for row in TABLE if row.label == entries[0].label)
    assert entries[0] == TraceEntry.from_row(taken, 0)
    assert (entries[0].source, entries[0].dest) == (AgentState.OBSERVE, AgentState.THINK)
    assert [e.source for e in entries[1:]] == [e.dest for e in entries[:-1]]
    assert trace[-1].dest == result.final_state
    assert trace[-1].turn == result.turns == 3
    assert trace[1:3] == tuple(entries[1:3])
    assert trace == tuple(entries)  # equal to the tuple of its entries
    assert trace == entries  # and to a list of them
    assert hash(trace) == hash(tuple(entries))
    assert repr(trace).startswith("Trace((TraceEntry(")


def test_entries_are_built_once_when_first_read() -> None:
    trace = finished().trace
    assert len(trace) == 10
    assert trace._entries is None  # nothing read yet: nothing built
    first = trace[0]
    assert trace[0] is first
    assert next(iter(trace)) is first


def test_a_result_reads_back_from_json_and_pickles_with_the_same_trace() -> None:
    result = finished()
    again = RunResult.model_validate_json(result.model_dump_json())
    assert isinstance(again.trace, Trace)
    assert again.trace == result.trace
    assert len(again.trace) == len(result.trace)
    assert again == result
    dumped = result.model_dump(mode="json")["trace"]
    assert dumped[0] == {
        "trigger": "observed",
        "source": "OBSERVE",
        "dest": "THINK",
        "guards": [],
        "label": dumped[0]["label"],
        "turn": 0,
    }
    for copied in (pickle.loads(pickle.dumps(result)), copy.deepcopy(result)):
        assert copied.trace == result.trace
        assert copied == result


def test_a_result_built_from_entries_takes_them_as_its_trace() -> None:
    result = finished()
    rebuilt = RunResult(**{**dict(result), "trace": tuple(result.trace)})
    assert isinstance(rebuilt.trace, Trace)
    assert rebuilt.trace == result.trace
