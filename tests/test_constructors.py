"""quick_init and builder: the same records as the dataclass would build, and refusals for
classes they cannot speed up safely."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from agent_fsm.constructors import builder, quick_init
from agent_fsm.messages import ModelRequest
from agent_fsm.state import TraceEntry
from agent_fsm.table import TABLE


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    x: int
    y: int = 0
    label: str = "origin"


@pytest.mark.parametrize("make", [Point, builder(Point)], ids=["class", "builder"])
def test_it_builds_the_same_frozen_record_with_the_same_signature(
    make: Callable[..., Point],
) -> None:
    point = make(x=1, label="p")
    assert type(point) is Point
    assert (point.x, point.y, point.label) == (1, 0, "p")
    assert point == Point(x=1, y=0, label="p")
    assert hash(point) == hash(Point(x=1, label="p"))
    assert dataclasses.replace(point, y=5) == Point(x=1, y=5, label="p")
    assert repr(point) == "Point(x=1, y=0, label='p')"
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 2  # type: ignore[misc]
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'x'"):
        make()
    with pytest.raises(TypeError):
        make(1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        make(x=1, z=2)


def test_the_engine_records_use_it() -> None:
    row = TABLE[0]
    entry = TraceEntry.from_row(row, 3)
    assert (entry.source, entry.dest, entry.label, entry.turn) == (
        row.source,
        row.dest,
        row.label,
        3,
    )
    request = ModelRequest(messages=(), tools=(), run_id="r", turn=1)
    assert request.on_delta is None
    for cls in (TraceEntry, ModelRequest):
        assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"


def test_classes_it_cannot_speed_up_are_refused() -> None:
    @dataclass(slots=True, kw_only=True)
    class Mutable:
        x: int

    @dataclass(frozen=True, kw_only=True)
    class NoSlots:
        x: int

    @dataclass(frozen=True, slots=True)
    class Positional:
        x: int

    @dataclass(frozen=True, slots=True, kw_only=True)
    class Factory:
        xs: list[int] = field(default_factory=list)

    @dataclass(frozen=True, slots=True, kw_only=True)
    class PostInit:
        x: int

        def __post_init__(self) -> None:
            pass

    for cls, message in [
        (PostInit, "__post_init__ would not run"),
        (Mutable, "frozen dataclass with slots"),
        (NoSlots, "frozen dataclass with slots"),
        (Positional, "keyword-only"),
        (Factory, "default factories"),
    ]:
        with pytest.raises(TypeError, match=message):
            quick_init(cls)
        with pytest.raises(TypeError, match=message):
            builder(cls)
    with pytest.raises(TypeError, match="not a class"):
        builder(lambda: None)
