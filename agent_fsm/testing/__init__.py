"""Test support: fake models and reply helpers.

``from agent_fsm.testing import ScriptedModel, FunctionModel, call, reply``
"""

from agent_fsm.testing.models import (
    FunctionModel,
    ScriptedModel,
    ScriptItem,
    call,
    raw_call,
    reply,
)

__all__ = ["FunctionModel", "ScriptItem", "ScriptedModel", "call", "raw_call", "reply"]
