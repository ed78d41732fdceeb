"""Models: the protocol and its adapters.

The adapters are imported lazily, so each SDK is loaded only by programs that use it (and the
optional ones, ``anthropic`` and ``google-genai``, need not be installed at all). Which module
holds each one is ``registry.PROVIDERS``'s to say, as it is for the command line.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agent_fsm.models.base import Model, ModelCallError
from agent_fsm.models.registry import PROVIDERS

if TYPE_CHECKING:
    from agent_fsm.models.anthropic_messages import AnthropicModel
    from agent_fsm.models.gemini import GeminiModel
    from agent_fsm.models.openai_chat import OpenAIChatModel
    from agent_fsm.models.openai_responses import OpenAIResponsesModel

__all__ = [
    "AnthropicModel",
    "GeminiModel",
    "Model",
    "ModelCallError",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
]

_ADAPTERS = {provider.cls: provider.module for provider in PROVIDERS.values()}


def __getattr__(name: str) -> Any:
    module = _ADAPTERS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
