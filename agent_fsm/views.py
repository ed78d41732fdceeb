"""Read-only views of a run's state, for the user code that reads it: a table's own guards,
the work of a ``CustomState`` (``StepContext.state``) and the agent's reflector.

The proof that every run ends rests on fields only the engine writes: the turn and retry
counts, the usage, the transcript. A guard that set ``state.turns = 0`` ran a three-turn agent
for 77 transitions; work that appended a reply with a tool call left the call unanswered.
So user code gets a view: reading works as on the ``RunState`` itself (attributes, lists,
dicts, the loop detector's record), and any write, at any depth, raises
``ReadOnlyStateError`` naming the field, which the engine reports as the user code's fault
(``TableError`` for guards and work) before the run moves.

A view wraps, it does not copy: building one costs one object, and the containers inside are
wrapped only when read, so a guard that reads one field pays for that field alone. Frozen
values (messages, usage, requests, enums, numbers, text) are returned as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NoReturn, cast, overload

from agent_fsm.state import RunState

__all__ = ["ReadOnlyStateError", "read_only", "view_of"]


class ReadOnlyStateError(AttributeError):
    """User code tried to change the run's state through a read-only view."""


def _refuse(what: str) -> NoReturn:
    raise ReadOnlyStateError(
        f"{what} is read-only here: guards, a custom state's work and the reflector read the "
        "run, the engine writes it (a custom state keeps its own data in StepContext.notes)"
    )


def read_only(value: Any, path: str) -> Any:
    """``value`` as user code may see it: lists, dicts, sets and mutable dataclasses wrapped
    so that they cannot be changed; everything else as it is. ``path`` names it in errors."""
    if isinstance(value, list):
        return _ListView(value, path)
    if isinstance(value, dict):
        return _DictView(value, path)
    if isinstance(value, set):
        return frozenset(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        params = getattr(type(value), "__dataclass_params__", None)
        if params is None or not params.frozen:
            return _ObjectView(value, path)
    return value


def view_of(state: RunState) -> RunState:
    """A read-only view of ``state`` (typed as a ``RunState``, which it reads like)."""
    return cast(RunState, _ObjectView(state, "RunState"))


class _ObjectView:
    """The attributes of a mutable object, each read through ``read_only``."""

    __slots__ = ("_path", "_target")

    def __init__(self, target: object, path: str) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name: str) -> Any:
        return read_only(getattr(self._target, name), f"{self._path}.{name}")

    def __setattr__(self, name: str, value: object) -> None:
        _refuse(f"{self._path}.{name}")

    def __delattr__(self, name: str) -> None:
        _refuse(f"{self._path}.{name}")

    def __repr__(self) -> str:
        return f"<read-only {self._target!r}>"

    def __eq__(self, other: object) -> bool:
        return bool(self._target == (other._target if isinstance(other, _ObjectView) else other))

    __hash__ = None  # type: ignore[assignment]


class _ListView(Sequence[Any]):
    """A list, readable and not changeable (slices are tuples of views)."""

    __slots__ = ("_items", "_path")

    def __init__(self, items: list[Any], path: str) -> None:
        self._items = items
        self._path = path

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Any, ...]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return tuple(read_only(item, self._path) for item in self._items[index])
        return read_only(self._items[index], f"{self._path}[{index}]")

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Any]:
        return (read_only(item, self._path) for item in self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _ListView):
            other = other._items
        return isinstance(other, list | tuple) and list(self._items) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<read-only {self._items!r}>"

    def __getattr__(self, name: str) -> NoReturn:
        if name in ("append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"):
            _refuse(self._path)
        raise AttributeError(name)

    def __setitem__(self, index: object, value: object) -> None:
        _refuse(self._path)

    def __delitem__(self, index: object) -> None:
        _refuse(self._path)

    def __iadd__(self, other: object) -> NoReturn:
        _refuse(self._path)


class _DictView(Mapping[Any, Any]):
    """A dict, readable and not changeable."""

    __slots__ = ("_items", "_path")

    def __init__(self, items: dict[Any, Any], path: str) -> None:
        self._items = items
        self._path = path

    def __getitem__(self, key: Any) -> Any:
        return read_only(self._items[key], f"{self._path}[{key!r}]")

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _DictView):
            other = other._items
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<read-only {self._items!r}>"

    def __getattr__(self, name: str) -> NoReturn:
        if name in ("pop", "popitem", "clear", "update", "setdefault"):
            _refuse(self._path)
        raise AttributeError(name)

    def __setitem__(self, key: object, value: object) -> None:
        _refuse(self._path)

    def __delitem__(self, key: object) -> None:
        _refuse(self._path)

    def __ior__(self, other: object) -> NoReturn:
        _refuse(self._path)
