"""A run's checkpoint header, encoded field by field: each field's JSON is kept while its value
is the very object encoded last time.

A durable run saves its header (``encoding.encode_header``: every RunState field but
``messages`` and ``trace``) after almost every transition, and between two saves only a few
of its ~60 fields change (the state, the elapsed time, a turn's counters and usage); the
agent record, the limits' counters and the stop fields of a run going on stay as they were.
Encoding the whole header on every save was ~90k instructions, a fifth of what durability adds
to a turn (``benchmarks/instructions.py --only durable``, issue 39). ``HeaderEncoder`` gives
the same bytes as ``encode_header`` and encodes again only the fields that changed.

What "changed" means rests on how RunState is written (``state``: its fields are assigned by
their writers): a field whose default is hashable (a str, a number, None, an enum, a tuple, a
frozen model) is given a new value when it changes, never changed in place, so a value that
is the very object encoded last time encodes the same. The other fields (lists, dicts, the
loop detector's and the calibration's dataclasses) are changed in place: they are encoded on
every save, except when empty.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Hashable
from dataclasses import MISSING, fields
from itertools import compress
from typing import Any, get_type_hints

from pydantic import TypeAdapter
from pydantic_core import PydanticSerializationError, SchemaSerializer

import agent_fsm.durable.encoding as encoding
from agent_fsm.state import RunState
from agent_fsm.table import TERMINAL_STATES

__all__ = ["HeaderEncoder", "RunHeaders"]


def _default(item: Any) -> object:
    return item.default_factory() if item.default_factory is not MISSING else item.default


_FIELDS = tuple(item for item in fields(RunState) if item.name not in encoding.HEADER_EXCLUDE)
_HINTS = get_type_hints(RunState, include_extras=True)
_KEYS = tuple(json.dumps(item.name).encode() + b":" for item in _FIELDS)
"""Each field's key, as ``RUN_STATE_ADAPTER`` writes it, in RunState's order (its order)."""
_SERIALIZERS: tuple[SchemaSerializer, ...] = tuple(
    TypeAdapter(_HINTS[item.name]).serializer for item in _FIELDS
)
_VALUES = operator.attrgetter(*(item.name for item in _FIELDS))
_IN_PLACE: tuple[tuple[int, type | None, bytes], ...] = tuple(
    (n, type(default), _KEYS[n] + _SERIALIZERS[n].to_json(default))
    if not default
    else (n, None, b"")
    for n, item in enumerate(_FIELDS)
    if not isinstance(default := _default(item), Hashable)
)
"""The fields changed in place (their default is a list, a dict or a mutable dataclass): their
index, and for an empty container by default, its type and the field's JSON when empty."""
_ALL = range(len(_FIELDS))


class HeaderEncoder:
    """Encodes the headers of one run, one save after another (a store keeps one per run).

    ``encode`` returns what ``encoding.encode_header`` returns for the same state, byte for
    byte (``tests/test_header.py``), raising what it raises.
    """

    __slots__ = ("_parts", "_values")

    def __init__(self) -> None:
        self._values: tuple[Any, ...] | None = None
        """The field values last encoded (held, so that none of their ids is reused)."""
        self._parts: list[bytes] = []
        """``"name":json`` of each field, as last encoded."""

    def encode(self, state: RunState) -> tuple[int, bytes]:
        """The schema version and JSON header of ``state`` (``encoding.encode_header``)."""
        values: tuple[Any, ...] = _VALUES(state)
        last, self._values = self._values, None  # kept only once every part is good
        try:
            if last is None:
                self._parts = parts = [
                    key + serializer.to_json(value)
                    for key, serializer, value in zip(_KEYS, _SERIALIZERS, values, strict=True)
                ]
            else:
                parts = self._parts
                for n in compress(_ALL, map(operator.is_not, values, last)):
                    parts[n] = _KEYS[n] + _SERIALIZERS[n].to_json(values[n])
                for n, empty, empty_json in _IN_PLACE:
                    value = values[n]
                    if not value and type(value) is empty:
                        parts[n] = empty_json
                    else:
                        parts[n] = _KEYS[n] + _SERIALIZERS[n].to_json(value)
        except PydanticSerializationError:  # a lone surrogate, a note that is not JSON
            return encoding.encode_header(state)  # which cleans the text, or names the note
        self._values = values
        # read here, not imported: the store contract saves as other versions by patching it
        return encoding.CHECKPOINT_SCHEMA_VERSION, b"{" + b",".join(parts) + b"}"


class RunHeaders:
    """The header encoders of a store's runs, by run id: one ``HeaderEncoder`` per run while
    it goes on (``SQLiteStore``, ``PostgresStore``).

    A run saved from two threads at once is given two encoders: each is exact on its own.
    """

    __slots__ = ("_encoders",)

    def __init__(self) -> None:
        self._encoders: dict[str, HeaderEncoder] = {}

    def encode(self, state: RunState) -> tuple[int, bytes]:
        """The schema version and JSON header of ``state`` (``encoding.encode_header``), from
        its run's encoder. A run that stopped gives its encoder up: most are never saved
        again."""
        run_id = state.run_id
        encoder = self._encoders.pop(run_id, None) or HeaderEncoder()
        encoded = encoder.encode(state)
        if state.state not in TERMINAL_STATES:
            self._encoders[run_id] = encoder
        return encoded

    def forget(self, run_id: str) -> None:
        """Drop the run's encoder (the run is deleted)."""
        self._encoders.pop(run_id, None)
