"""Events: every class keeps its dataclass contract under the faster ``__init__``, and the
EventBus isolates subscribers from each other and from the run."""

from __future__ import annotations

import dataclasses
from typing import Any, get_args

import pytest

from agent_fsm.events import EVENT_ADAPTER, Event, EventBus, RunStarted, StateChanged, ToolFinished
from agent_fsm.messages import ToolStatus
from agent_fsm.table import AgentState

EVENT_CLASSES: tuple[type, ...] = get_args(get_args(Event)[0])


def _required(cls: type) -> dict[str, Any]:
    """A value for each field of ``cls`` that has no default."""
    samples: dict[str, Any] = {
        "run_id": "run-1",
        "turn": 2,
        "source": AgentState.THINK,
        "dest": AgentState.ACT,
        "state": AgentState.THINK,
        "final_state": AgentState.DONE,
    }
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if field.default is dataclasses.MISSING:
            values[field.name] = samples.get(field.name, f"{field.name}-value")
    return values


@pytest.mark.parametrize("cls", EVENT_CLASSES, ids=lambda c: c.__name__)
def test_each_event_class_builds_like_its_dataclass_and_stays_frozen(cls: type) -> None:
    fields = dataclasses.fields(cls)
    assert fields[0].name == "kind"
    event = cls(**_required(cls))
    for field in fields:  # every field was stored, defaults included
        expected = _required(cls).get(field.name, field.default)
        assert getattr(event, field.name) == expected
    assert event == cls(**_required(cls))
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.run_id = "changed"  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="missing"):
        cls()
    with pytest.raises(TypeError):
        cls("positional", **_required(cls))


def test_events_round_trip_through_the_trace_adapter() -> None:
    event = ToolFinished(
        run_id="r",
        turn=1,
        call_id="c1",
        name="lookup",
        status=ToolStatus.ERROR,
        output="boom",
        duration_s=0.5,
        is_error=True,
        output_chars=4,
        details={"runtime": {"attempts": 2}},
        attempts=2,
    )
    assert EVENT_ADAPTER.validate_json(EVENT_ADAPTER.dump_json(event)) == event


def test_the_bus_delivers_in_order_and_survives_a_failing_handler() -> None:
    seen: list[str] = []
    failed: list[str] = []

    def broken(event: Event) -> None:
        raise RuntimeError("observer bug")

    bus = EventBus(
        [lambda e: seen.append(f"first:{e.kind}")], on_handler_error=lambda e: failed.append(e.kind)
    )
    bus.subscribe(broken)
    bus.subscribe(lambda e: seen.append(f"last:{e.kind}"))
    bus.emit(RunStarted(run_id="r", input="go"))
    assert seen == ["first:run_started", "last:run_started"]
    assert failed == ["run_started"]


def test_the_bus_offers_no_emitter_while_nobody_listens() -> None:
    bus = EventBus()
    assert not bus
    assert bus.emitter is None
    got: list[Event] = []
    bus.subscribe(got.append)
    emit = bus.emitter
    assert emit is not None
    event = StateChanged(
        run_id="r",
        source=AgentState.OBSERVE,
        dest=AgentState.THINK,
        trigger="observed",
        guards=(),
        label="think",
        turn=0,
    )
    emit(event)
    assert got == [event]
