"""Pure conversion of agent_fsm's transcript and tools to OpenAI Responses API requests.

Kept apart from ``openai_responses`` so that it never imports ``openai``: everything here works
on plain JSON-shaped data. The adapter is stateless: every request carries the whole
transcript as ``input`` items, so nothing depends on what the server stored.

Reasoning items (``type: reasoning``) must go back before the items they preceded, or a
reasoning model loses its chain of thought between tool calls (and, for an item sent back
without what followed it, the API answers 400). The transcript has no field for them, so the
reply assembler (``openai_responses_reply``) puts the reply's item layout in
``AssistantMessage.provider_data["openai-responses"]`` (only when the reply had reasoning
items) and ``to_responses_input`` lays the items out again from it:
``{"output": [entry, ...]}``, one entry per output item in the server's order, where a
reasoning entry is the item itself (``REASONING_FIELDS``), a message is
``{"type": "message", "id": ...}`` and a function call is
``{"type": "function_call", "index": <its position in tool_calls>}`` (a position, because the
engine may rename a call id it finds empty or repeated).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from typing import Any

from agent_fsm.content import MB, FilePart, ImagePart, PartSupport, TextPart
from agent_fsm.messages import (
    AssistantMessage,
    Message,
    OutputFormat,
    SystemMessage,
    ToolMessage,
    ToolSpec,
    UserMessage,
)
from agent_fsm.models.base import replayable_arguments
from agent_fsm.models.openai_convert import OPENAI_IMAGE_TYPES
from agent_fsm.models.openai_schema import strict_schema
from agent_fsm.models.parts import PartBudget, file_name

__all__ = [
    "PROVIDER_KEY",
    "RESPONSES_PARTS",
    "REASONING_FIELDS",
    "text_format",
    "to_responses_input",
    "to_responses_tools",
]

PROVIDER_KEY = "openai-responses"
"""The adapter's key in ``AssistantMessage.provider_data``."""

REASONING_FIELDS = ("type", "id", "summary", "encrypted_content", "content")
"""The fields of a reasoning item the API takes back as input (what it only reports, such as
``status``, is not kept)."""


RESPONSES_PARTS = PartSupport(
    provider="OpenAI Responses",
    image_types=OPENAI_IMAGE_TYPES,
    file_types=frozenset({"application/pdf"}),
    image_urls=True,
    file_urls=True,
    max_image_bytes=20 * MB,
    max_file_bytes=32 * MB,
    max_request_bytes=50 * MB,
    tool_results="in the function_call_output's output, as input_text, input_image, input_file",
)
"""What the Responses API takes: images as ``input_image`` (a URL or a ``data:`` URL), PDFs
as ``input_file`` (``file_data``, a ``data:`` URL with a file name, or ``file_url``), in user
messages and in tool results alike. Its documented limits: 50 MB per request, 32 MB of
files."""


def to_responses_input(
    messages: Iterable[Message], *, stored: bool = False, support: PartSupport | None = None
) -> tuple[str | None, list[dict[str, Any]]]:
    """Convert a transcript to ``(instructions, input)``.

    The system messages that open the transcript become ``instructions`` (joined by a blank
    line): the API's own field for the system prompt. A system message later in the transcript
    stays where it is, as a ``system`` input message, so its order is kept.

    Every item names its ``type`` (a message item too, where the API would infer it). An
    assistant message becomes an assistant message item (when it has text) and one
    ``function_call`` item per call, with its reasoning items where they were (see the
    module docstring); a tool result becomes a ``function_call_output`` item. Call arguments
    that are not a JSON object go back as ``{}`` (``replayable_arguments``);
    ``ToolMessage.status`` and ``details`` are never sent: the model sees only the content.

    Args:
        messages: the transcript, oldest first.
        stored: whether the server stores responses (``store=True``). Without storage a
            reasoning item is only replayable with its ``encrypted_content``; one without it
            is left out, since the server would look its id up and fail.
        support: what the server takes of images and files; each part is checked against
            it (``PartBudget``). A user message with ``parts`` goes as a list of
            ``input_text``, ``input_image`` and ``input_file`` items, a tool result with
            parts as a ``function_call_output`` whose ``output`` is such a list.

    Raises:
        TypeError: for an object that is not a transcript message (a programming error).
        ModelCallError: not transient: a part ``support`` says the server cannot take.
    """
    budget: PartBudget | None = None
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, SystemMessage):
            if items:
                items.append(_input_message("system", message.content))
            else:
                instructions.append(message.content)
        elif isinstance(message, UserMessage):
            if message.parts:
                budget = budget or PartBudget(support)
                items.append(_input_message("user", _input_parts(message, budget)))
            else:
                items.append(_input_message("user", message.content))
        elif isinstance(message, AssistantMessage):
            items.extend(_assistant_items(message, stored=stored))
        elif isinstance(message, ToolMessage):
            output: str | list[dict[str, Any]] = message.content
            if message.parts:
                budget = budget or PartBudget(support)
                output = _input_parts(message, budget)
            items.append(
                {"type": "function_call_output", "call_id": message.tool_call_id, "output": output}
            )
        else:
            raise TypeError(f"not a transcript message: {type(message).__name__}")
    return ("\n\n".join(instructions) if instructions else None), items


def _input_parts(message: UserMessage | ToolMessage, budget: PartBudget) -> list[dict[str, Any]]:
    """A message's text and parts as Responses input content, each part checked."""
    content: list[dict[str, Any]] = []
    if message.content:
        content.append({"type": "input_text", "text": message.content})
    for position, part in enumerate(message.parts, 1):
        budget.take(part)
        content.append(_input_part(part, position))
    return content


def _input_part(part: TextPart | ImagePart | FilePart, position: int) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "input_text", "text": part.text}
    if isinstance(part, ImagePart):
        url = part.url if part.url is not None else part.data_url()
        return {"type": "input_image", "image_url": url, "detail": "auto"}
    if part.url is not None:
        return {"type": "input_file", "file_url": part.url}
    return {
        "type": "input_file",
        "file_data": part.data_url(),
        "filename": file_name(part, position),
    }


def _assistant_items(message: AssistantMessage, *, stored: bool) -> list[dict[str, Any]]:
    layout = _layout(message)
    calls = [_call_item(message, index) for index in range(len(message.tool_calls))]
    if layout is None:
        text = [_message_item(message.content, None)] if message.content else []
        return text + calls
    out: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []  # reasoning waiting for the item it preceded
    text_sent = not message.content
    if not any(entry.get("type") == "message" for entry in layout):
        layout = [{"type": "message"}, *layout]  # text the layout does not place goes first
    for entry in layout:
        kind = entry.get("type")
        if kind == "reasoning":
            if stored or isinstance(entry.get("encrypted_content"), str):
                pending.append({k: copy.deepcopy(entry[k]) for k in REASONING_FIELDS if k in entry})
        elif kind == "message" and not text_sent:
            item_id = entry.get("id")
            out += [*pending, _message_item(message.content, item_id)]
            pending, text_sent = [], True
        elif kind == "function_call":
            index = entry.get("index")
            if type(index) is int and 0 <= index < len(calls) and calls[index]:
                out += [*pending, calls[index]]
                pending, calls[index] = [], {}
    # Calls the layout does not place (a transcript edited by hand) follow in order; reasoning
    # with nothing after it is dropped, since the API refuses it without its following item.
    rest = [call for call in calls if call]
    return out + ([*pending, *rest] if rest else [])


def _layout(message: AssistantMessage) -> list[dict[str, Any]] | None:
    data = (message.provider_data or {}).get(PROVIDER_KEY)
    entries = data.get("output") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None
    return [entry for entry in entries if isinstance(entry, dict)]


def _input_message(role: str, content: Any) -> dict[str, Any]:
    """A message input item, typed: the API infers a missing ``type``, but compatible servers
    do not (llama-server answers 400 "Cannot determine type of 'item'"), so every item says
    what it is."""
    return {"type": "message", "role": role, "content": content}


def _message_item(text: str, item_id: object) -> dict[str, Any]:
    if not isinstance(item_id, str) or not item_id:
        return _input_message("assistant", text)
    # The output item as the server wrote it: a reasoning item before it is matched to it.
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _call_item(message: AssistantMessage, index: int) -> dict[str, Any]:
    call = message.tool_calls[index]
    return {
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": replayable_arguments(call.arguments),
    }


def to_responses_tools(tools: Iterable[ToolSpec], *, strict: bool = False) -> list[dict[str, Any]]:
    """Convert tool specs to Responses ``tools`` (``{"type": "function", "name", ...}``, flat,
    not nested under ``function`` as in Chat Completions), copying every schema.

    Every tool says ``strict`` explicitly, since the Responses API makes a function strict when
    the field is missing. With ``strict=True`` each schema is adapted by
    ``openai_schema.strict_schema``; a tool whose schema strict mode cannot express is sent
    unchanged with ``"strict": false`` rather than with a silently different meaning.
    """
    out: list[dict[str, Any]] = []
    for spec in tools:
        adapted = strict_schema(spec.parameters) if strict else None
        out.append(
            {
                "type": "function",
                "name": spec.name,
                "description": spec.description,
                "parameters": copy.deepcopy(spec.parameters) if adapted is None else adapted,
                "strict": adapted is not None,
            }
        )
    return out


def text_format(output: OutputFormat, *, strict: bool = False) -> dict[str, Any]:
    """The ``text.format`` that asks for a reply matching ``output``'s JSON Schema.

    With ``strict=True`` the schema is adapted as tools are, when strict mode can express it;
    otherwise it is sent as it is with ``"strict": false``, which the model takes as guidance.
    """
    adapted = strict_schema(output.schema) if strict else None
    return {
        "type": "json_schema",
        "name": re.sub(r"[^a-zA-Z0-9_-]", "_", output.name)[:64] or "output",
        "schema": copy.deepcopy(output.schema) if adapted is None else adapted,
        "strict": adapted is not None,
    }
