"""Token estimation for budget checks made before a model call.

The estimate is deliberately cheap and slightly pessimistic (about four characters per token,
plus a per-message overhead) because it gates whether a call may start: overestimating stops a
run a little early, underestimating could overspend the budget. It is computed once per
message as the message is appended, so the prompt estimate is O(1) per turn.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from agent_fsm.messages import AssistantMessage, Message, ToolMessage, ToolSpec

__all__ = ["estimate_message_tokens", "estimate_text_tokens", "estimate_tools_tokens"]

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4
"""Role markers and separators that chat formats add around every message."""


def estimate_text_tokens(text: str) -> int:
    """Estimated tokens in ``text`` (rounded up, never negative)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def estimate_message_tokens(message: Message) -> int:
    """Estimated tokens one message adds to a prompt."""
    tokens = MESSAGE_OVERHEAD_TOKENS + estimate_text_tokens(message.content)
    if isinstance(message, AssistantMessage):
        for call in message.tool_calls:
            tokens += MESSAGE_OVERHEAD_TOKENS + estimate_text_tokens(call.name + call.arguments)
    elif isinstance(message, ToolMessage):
        tokens += estimate_text_tokens(message.tool_call_id)
    return tokens


def estimate_tools_tokens(tools: Iterable[ToolSpec]) -> int:
    """Estimated tokens the tool definitions add to every request."""
    return sum(
        MESSAGE_OVERHEAD_TOKENS
        + estimate_text_tokens(spec.name + spec.description + json.dumps(spec.parameters))
        for spec in tools
    )
