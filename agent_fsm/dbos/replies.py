"""What a DBOS run's model call ended with (``Replied``), and its JSON: the record a model
call keeps in the run's journal when it is made without a step
(``agent_fsm.dbos.model_calls``), or that DBOS pickles when it is made as one
(``agent_fsm.dbos.steps``). Either way a replay gets the same outcome back."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import TypeAdapter

from agent_fsm.messages import ModelResponse
from agent_fsm.state import ModelFailure

__all__ = ["Replied", "from_json", "to_json"]


@dataclass(frozen=True, slots=True)
class Replied:
    """A model call's outcome: the reply, or the failure, or the deadline's cut, or the
    cancel request that stopped it before it was made."""

    ended_at: float
    response: ModelResponse | None = None
    failure: ModelFailure | None = None
    cut: bool = False
    cancelled: str | None = None
    """Why no call was made: the run was cancelled from outside (the request's reason)."""
    began_at: float | None = None
    """The activation's start, when this was its first step or recorded call
    (``RunTime.step``, ``RunTime.begin``)."""


_JSON: TypeAdapter[Replied] = TypeAdapter(Replied)


def to_json(replied: Replied) -> str:
    """``replied`` as the journal keeps it: one JSON object, its fields by name (the reply
    and the failure as their models dump). Floats are written so that they read back equal.

    Raises:
        pydantic_core.PydanticSerializationError: a text in it cannot be encoded (the
            engine cleans every text where it enters the run, so none should).
    """
    return _JSON.dump_json(replied).decode()


def from_json(text: str) -> Replied:
    """The outcome ``to_json`` wrote.

    Raises:
        pydantic.ValidationError: ``text`` is no such record.
    """
    return _JSON.validate_json(text)
