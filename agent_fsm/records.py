"""One fields set for every transcript record built with the same fields:
``share_fields_sets``.

pydantic keeps on every model instance the names of the fields it was given
(``model_fields_set``, what ``model_dump(exclude_unset=True)`` reads) in a set of the
instance's own: 216 bytes, over 700 once it holds five names, and one more container for the
cyclic collector to walk. A transcript holds many messages, tool calls and usages, almost all
with one of a handful of fields sets: a run parked in its fifth tool call held sixteen such
sets, a fifth of its memory (``benchmarks/parked_runs.py``). The engine hands each record it
keeps for the life of a run (the model's replies, the user's messages: ``RunContext.append``) to
``share_fields_sets``; the records it builds itself with the same fields every time (a tool's
answer, the run's usage) get their shared set as they are built (``give_fields_set``).

Sharing is safe for frozen models only: pydantic changes a fields set in place when a field is
assigned, which a frozen model refuses, and ``model_copy`` copies the set before adding the
fields it updates. The shared set stays a ``set`` (``model_copy`` needs one). It is done where
a record is kept, not in a ``model_post_init`` hook that every record built would pay for:
the hook cost the engine 9% more instructions per turn (``benchmarks/instructions.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

__all__ = ["fields_set", "give_fields_set", "share_fields_sets"]

_shared: dict[frozenset[str], set[str]] = {}
"""The shared sets, by their names. Each is a subset of one record class's fields, so the
table stays small (a few dozen sets for the transcript's six classes, 180 at the very most)."""
give_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
"""``give_fields_set(record, shared)``: make ``shared`` (from ``fields_set``) the fields set
of ``record``, a frozen record built with exactly those fields. For a builder that always
gives the same fields: one call, where ``share_fields_sets`` looks the set up."""


def share_fields_sets(records: Iterable[BaseModel]) -> None:
    """Replace the fields set of each of ``records`` (frozen transcript records) by the equal
    set shared by every record given here with the same fields. ``model_fields_set`` stays
    equal to what pydantic gave; like any frozen model's, it must not be changed in place.
    Must not raise."""
    shared_sets, put = _shared, give_fields_set
    for record in records:
        given = record.__pydantic_fields_set__
        if type(given) is set:  # (a model_construct caller's own kind of set is left as is)
            shared = shared_sets.setdefault(frozenset(given), given)
            if shared is not given:
                put(record, shared)


def fields_set(*names: str) -> set[str]:
    """The set shared by the records built with exactly the fields ``names``."""
    given = set(names)
    return _shared.setdefault(frozenset(given), given)
