"""Models: the protocol and its adapters.

``OpenAIChatModel`` is imported lazily, so ``openai`` is loaded only by programs that use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent_fsm.models.base import Model, ModelCallError

if TYPE_CHECKING:
    from agent_fsm.models.openai_chat import OpenAIChatModel

__all__ = ["Model", "ModelCallError", "OpenAIChatModel"]


def __getattr__(name: str) -> Any:
    if name == "OpenAIChatModel":
        from agent_fsm.models.openai_chat import OpenAIChatModel

        return OpenAIChatModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
