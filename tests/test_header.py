"""``durable.header.HeaderEncoder``: the header of each save, encoding again only the fields
that changed, is byte for byte what ``encoding.encode_header`` writes (issue 39)."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import types
import typing

import pydantic
import pytest

from agent_fsm import Agent, tool
from agent_fsm.durable import SQLiteStore, header
from agent_fsm.durable.checkpoint import MemoryStore
from agent_fsm.durable.encoding import encode_header
from agent_fsm.durable.header import HeaderEncoder
from agent_fsm.errors import CheckpointError
from agent_fsm.messages import Usage
from agent_fsm.prompt import ContextEdits
from agent_fsm.state import ControlKind, ControlRequest, RunState
from agent_fsm.table import AgentState
from agent_fsm.testing import ScriptedModel, call, reply
from agent_fsm.testing.store_kit import sample_state


class _Checked(MemoryStore):
    """A MemoryStore that encodes each save's header with one encoder per run, as SQLiteStore
    does, and compares it with ``encode_header``'s."""

    def __init__(self) -> None:
        super().__init__()
        self.encoders: dict[str, HeaderEncoder] = {}
        self.saves = 0

    def save(self, state: RunState) -> None:  # type: ignore[override]
        encoder = self.encoders.setdefault(state.run_id, HeaderEncoder())
        assert encoder.encode(state) == encode_header(state)
        self.saves += 1
        super().save(state)


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def test_every_save_of_runs_that_pause_and_resume_encodes_what_encode_header_does() -> None:
    store = _Checked()
    model = ScriptedModel(
        [
            reply("", call("add", a=1, b=2), usage=(10, 2)),
            reply("", call("add", a=1, b=2), usage=(12, 3)),  # the loop detector's memory moves
            reply("", call("ask_user", question="More?"), usage=(14, 1)),
            reply("", call("add", a=3, b=4), usage=(20, 2)),
            reply("4 and 7", usage=(22, 2)),
        ]
    )
    agent = Agent(model=model, tools=[add], store=store)
    paused = agent.run_sync("Add things.")
    done = asyncio.run(agent.resume(paused.run_id, "Yes, 3 and 4."))
    assert done.output == "4 and 7"
    assert store.saves >= 12


def test_values_changed_in_place_or_replaced_are_encoded_again() -> None:
    state = sample_state()
    encoder = HeaderEncoder()
    assert encoder.encode(state) == encode_header(state)
    changes = [
        lambda: state.notes.update(plan=["a", "b"]),  # in place
        lambda: state.notes["plan"].append("c"),  # deeper in place
        lambda: state.pending_input.append("more"),
        lambda: state.pending_input.clear(),
        lambda: state.loop.recent_calls.append("add:{}"),
        lambda: state.calibration.learn(100, 120),
        lambda: state.resumed_at.append(7),
        lambda: setattr(state, "usage", state.usage + Usage(input_tokens=5)),
        lambda: setattr(state, "state", AgentState.ACT),
        lambda: setattr(state, "state", "CHECK"),  # a custom state
        lambda: setattr(state, "turns", state.turns + 1),
        lambda: setattr(state, "elapsed_s", 1.5),
        lambda: setattr(state, "context", ContextEdits(start=1)),
        lambda: setattr(state, "control", ControlRequest(kind=ControlKind.ASK_USER, text="?")),
        lambda: setattr(state, "control", None),
        lambda: setattr(state, "requests", [ControlRequest(kind=ControlKind.FINISH_TASK)]),
        lambda: state.requests.clear(),
        lambda: setattr(state, "withheld", ("add",)),
    ]
    for change in changes:
        change()
        assert encoder.encode(state) == encode_header(state)
    assert encoder.encode(state) == encode_header(state)  # nothing changed: the same again
    other = dataclasses.replace(state, run_id="run-2", notes={})
    assert encoder.encode(other) == encode_header(other)  # a whole other state


def test_a_lone_surrogate_is_written_as_encode_header_writes_it_and_bad_notes_are_refused() -> None:
    state = sample_state()
    encoder = HeaderEncoder()
    encoder.encode(state)
    state.notes["text"] = "half \ud800 a pair"
    assert encoder.encode(state) == encode_header(state)
    assert "\ufffd".encode() in encoder.encode(state)[1]
    del state.notes["text"]
    assert encoder.encode(state) == encode_header(state)
    state.notes["bad"] = object()
    with pytest.raises(CheckpointError, match=r"notes\['bad'\] is not a JSON value"):
        encoder.encode(state)
    del state.notes["bad"]
    assert encoder.encode(state) == encode_header(state)


def test_a_sqlite_store_loads_what_it_saved_save_after_save(tmp_path: object) -> None:
    """The store's encoder across saves of one run and its reload: each load equals the
    state saved, including after a save that only changed fields kept in place."""
    with SQLiteStore(f"{tmp_path}/runs.sqlite3") as store:
        state = sample_state()
        state.state = AgentState.THINK
        for turn in range(3):
            state.turns = turn
            state.notes.setdefault("turns", []).append(turn)
            state.loop.recent_calls.append(f"call {turn}")
            store.save(state)
            assert store.load(state.run_id) == state
        state.state = AgentState.DONE
        store.save(state)
        assert store.load(state.run_id) == state


def _immutable(hint: object, where: str, seen: set[type]) -> list[str]:
    """Where in type ``hint`` (named ``where``) a writer could change a value in place
    (empty: nowhere): the encoder keeps a field's JSON while its value is the same object."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return _immutable(args[0], where, seen)
    if origin in (typing.Union, types.UnionType, tuple, frozenset):
        return [bad for arg in args if arg is not Ellipsis for bad in _immutable(arg, where, seen)]
    if origin is typing.Literal or hint in (str, int, float, bool, type(None)):
        return []
    if not isinstance(hint, type):
        return [f"{where}: {hint!r}"]
    if issubclass(hint, enum.Enum) or hint in seen:
        return []
    seen.add(hint)
    if issubclass(hint, pydantic.BaseModel) and hint.model_config.get("frozen"):
        names = list(hint.model_fields)
    elif dataclasses.is_dataclass(hint) and hint.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        names = [item.name for item in dataclasses.fields(hint)]
    else:
        return [f"{where}: {hint.__name__}"]
    hints = typing.get_type_hints(hint, include_extras=True)
    return [
        bad for name in names for bad in _immutable(hints[name], f"{hint.__name__}.{name}", seen)
    ]


def test_every_field_the_encoder_keeps_while_unchanged_is_immutable_all_through() -> None:
    """A field the encoder does not encode on every save (its default is hashable) must be
    of a type no writer can change in place, down to its parts: else a save after an
    in-place change would store the old JSON. A new RunState field of a mutable type fails
    here until it is given a mutable default (then it is encoded on every save)."""
    in_place = {index for index, _, _ in header._IN_PLACE}
    kept = [item.name for n, item in enumerate(header._FIELDS) if n not in in_place]
    assert {"state", "usage", "agent"} <= set(kept)  # it reaches the fields it guards
    # dicts inside frozen records, filled when the record is made and never written after
    # (grep: nothing in agent_fsm assigns into them); any other mutable part fails
    built_once = {
        "AgentRecord.tools: dict[str, str]",
        "SubAgentPause.counted: dict[str, JsonValue]",
    }
    problems = {
        name: bad
        for name in kept
        if (bad := set(_immutable(header._HINTS[name], name, set())) - built_once)
    }
    assert problems == {}
