"""Token estimation for budget checks made before a model call.

The estimate is deliberately cheap and slightly pessimistic (about four characters per token,
plus a per-message overhead) because it gates whether a call may start: overestimating stops a
run a little early, underestimating could overspend the budget. It is computed once per
message as the message is appended, so the prompt estimate is O(1) per turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from agent_fsm.messages import AssistantMessage, Message, ToolMessage, ToolSpec

__all__ = [
    "TextCounter",
    "calibrate",
    "estimate_message_tokens",
    "estimate_text_tokens",
    "estimate_tools_tokens",
]

TextCounter = Callable[[str], int]
"""Counts the tokens of a text: ``estimate_text_tokens``, or a model's exact tokenizer (a
model may offer one as its ``count_tokens`` method)."""

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4
"""Role markers and separators that chat formats add around every message."""


def estimate_text_tokens(text: str) -> int:
    """Estimated tokens in ``text`` (rounded up, never negative)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def estimate_message_tokens(message: Message, count: TextCounter = estimate_text_tokens) -> int:
    """Estimated tokens one message adds to a prompt (``count`` counts its texts)."""
    tokens = MESSAGE_OVERHEAD_TOKENS + count(message.content)
    if isinstance(message, AssistantMessage):
        for call in message.tool_calls:
            tokens += MESSAGE_OVERHEAD_TOKENS + count(call.name + call.arguments)
    elif isinstance(message, ToolMessage):
        tokens += count(message.tool_call_id)
    return tokens


def estimate_tools_tokens(
    tools: Iterable[ToolSpec], count: TextCounter = estimate_text_tokens
) -> int:
    """Estimated tokens the tool definitions add to every request."""
    return sum(
        MESSAGE_OVERHEAD_TOKENS + count(spec.name + spec.description + json.dumps(spec.parameters))
        for spec in tools
    )


def calibrate(tokens: int, reported: int, estimated: int) -> int:
    """``tokens`` (an estimate) scaled by the ratio of the prompt tokens servers reported to
    the engine's estimate of the same prompts, rounded up. Never scaled down: an estimate
    that was too high stays on the safe side of the window and the budget."""
    if reported <= estimated:
        return tokens
    return -(-tokens * reported // estimated)
