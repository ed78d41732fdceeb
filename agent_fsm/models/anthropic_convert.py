"""Pure conversion of agent_fsm's transcript and tools to the Anthropic Messages wire format.

Kept apart from ``anthropic_messages`` so that it never imports ``anthropic``: everything here
works on plain JSON-shaped data. The rules of the Messages API that shape it:

- the system prompt is a top-level field, not a message;
- roles alternate: consecutive messages of one role are merged into one, so the results of
  one reply's calls go back in ONE user message, as ``tool_result`` blocks before any text;
- a call is a ``tool_use`` block whose ``input`` is an object, its result a ``tool_result``
  block, ``is_error`` set for a failed call;
- text blocks must not be empty, and a request whose history holds tool blocks must define
  tools, even when this call offers none;
- a tool's ``input_schema`` must be an object schema, and refuses ``anyOf``/``oneOf``/``allOf``
  at its top level (the API answers ``input_schema does not support oneOf, allOf, or anyOf at
  the top level``). Everywhere below the top level, JSON Schema is taken as it is (``$ref``
  and ``$defs`` included): tools are never sent in strict mode, whose grammar is narrower.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent_fsm.content import MB, FilePart, ImagePart, PartSupport, TextPart
from agent_fsm.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolSpec,
    ToolStatus,
    UserMessage,
)
from agent_fsm.models.base import replayable_arguments
from agent_fsm.models.parts import PartBudget

__all__ = [
    "ANTHROPIC_PARTS",
    "PROVIDER",
    "AnthropicPrompt",
    "ConvertedSchema",
    "SchemaProblem",
    "anthropic_schema",
    "stub_tools",
    "to_anthropic_prompt",
    "to_anthropic_tool_choice",
    "to_anthropic_tools",
    "tool_use_block",
    "wire_id",
]

PROVIDER = "anthropic"
"""The adapter's name: its key in ``AssistantMessage.provider_data``, and the provider named
in tool schema issues."""

_ID_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,200}$")
_COMBINATORS = ("allOf", "anyOf", "oneOf")
# Blocks the transcript holds itself; every other block type of a reply is kept verbatim.
_OWN_BLOCKS = frozenset({"text", "tool_use"})


ANTHROPIC_PARTS = PartSupport(
    provider="Anthropic",
    image_types=frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"}),
    file_types=frozenset({"application/pdf", "text/plain"}),
    image_urls=True,
    file_urls=True,
    max_image_bytes=5 * MB,
    max_file_bytes=32 * MB,
    max_request_bytes=32 * MB,
    tool_results="in the tool_result block's content, as image and document blocks",
)
"""What the Messages API takes: ``image`` blocks (base64 or URL source) and ``document``
blocks (a PDF as base64 or by URL, plain text as a text source), in user messages and in
``tool_result`` content alike. Its documented limits: 5 MB per image (as sent), 32 MB per
request."""


@dataclass(frozen=True, slots=True)
class AnthropicPrompt:
    """A transcript in the Messages API's terms."""

    system: str | None
    """The leading system messages, joined by blank lines; None when there are none."""
    messages: list[dict[str, Any]]
    """Alternating ``user``/``assistant`` messages, each with a list of content blocks."""
    tool_names: tuple[str, ...]
    """The tools the history's calls and results name, in order of first appearance."""


def to_anthropic_prompt(
    messages: Iterable[Message], *, support: PartSupport | None = None
) -> AnthropicPrompt:
    """Convert a transcript to the ``system`` field and ``messages``.

    The leading system messages become ``system``; a later one (a note the engine adds
    mid-run) is sent as user text, since the API has one system prompt per request.
    Assistant messages become ``text`` and ``tool_use`` blocks (arguments that are not a JSON
    object go as ``{}``, see ``replayable_arguments``), with the thinking blocks their
    ``provider_data`` kept, in their places (``AnthropicReply`` records them); tool results
    become ``tool_result`` blocks. Consecutive messages of one role are merged, tool results
    first in their user message; empty texts and messages are left out. Images and files
    (``parts``) become ``image`` and ``document`` blocks after their message's text, in a
    user message or in the ``tool_result``'s content, each checked against ``support``.

    Raises:
        TypeError: for an object that is not a transcript message (a programming error).
        ModelCallError: not transient: a part ``support`` says the server cannot take.
    """
    budget: PartBudget | None = None
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    names: dict[str, None] = {}
    for message in messages:
        if isinstance(message, SystemMessage) and not turns:
            system.append(message.content)
            continue
        if isinstance(message, SystemMessage | UserMessage):
            role, blocks = "user", _text_blocks(message.content)
            if isinstance(message, UserMessage) and message.parts:
                budget = budget or PartBudget(support)
                blocks.extend(_part_block(part, budget) for part in message.parts)
        elif isinstance(message, AssistantMessage):
            role, blocks = "assistant", assistant_blocks(message)
            names.update(dict.fromkeys(call.name for call in message.tool_calls))
        elif isinstance(message, ToolMessage):
            block = _result_block(message)
            if message.parts:
                budget = budget or PartBudget(support)
                block["content"] = _text_blocks(message.content) + [
                    _part_block(part, budget) for part in message.parts
                ]
            role, blocks = "user", [block]
            names[message.name] = None
        else:
            raise TypeError(f"not a transcript message: {type(message).__name__}")
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    for turn in turns:
        if turn["role"] == "user":  # stable: results first, then any text, as the API wants
            turn["content"].sort(key=lambda block: block["type"] != "tool_result")
    joined = "\n\n".join(text for text in system if text) or None
    return AnthropicPrompt(joined, turns, tuple(name for name in names if name))


def assistant_blocks(message: AssistantMessage) -> list[dict[str, Any]]:
    """The content blocks of one assistant message.

    Without kept blocks: the text, then one ``tool_use`` per call. With them (the reply had
    thinking or server-tool blocks, recorded under ``provider_data["anthropic"]["content"]``
    as the reply's block order, text and calls as placeholders): that order, the kept blocks
    verbatim (a thinking block's signature must go back unchanged), the whole text at the
    first text placeholder, each call at its own; text or calls the record does not place
    (the transcript was edited) go where they would without it.
    """
    text = _text_blocks(message.content)
    calls = [tool_use_block(call) for call in message.tool_calls]
    layout = _layout(message)
    if layout is None:
        return text + calls
    out: list[dict[str, Any]] = []
    placed: set[int] = set()
    text_placed = False
    for block in layout:
        kind = block.get("type")
        if kind == "text":
            out.extend([] if text_placed else text)
            text_placed = True
        elif kind == "tool_use":
            position = _unplaced_call(message.tool_calls, block.get("id"), placed)
            if position is not None:
                placed.add(position)
                out.append(calls[position])
        elif isinstance(kind, str):
            out.append(copy.deepcopy(block))
    if not text_placed and text:
        first_call = next((i for i, b in enumerate(out) if b["type"] == "tool_use"), len(out))
        out[first_call:first_call] = text
    out.extend(block for i, block in enumerate(calls) if i not in placed)
    return out


def _layout(message: AssistantMessage) -> list[dict[str, Any]] | None:
    data = (message.provider_data or {}).get(PROVIDER)
    content = data.get("content") if isinstance(data, dict) else None
    if not isinstance(content, list):
        return None
    return [block for block in content if isinstance(block, dict)]


def _unplaced_call(calls: tuple[ToolCall, ...], call_id: object, placed: set[int]) -> int | None:
    return next((i for i, call in enumerate(calls) if call.id == call_id and i not in placed), None)


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    """A call as the ``tool_use`` block that goes back to the API."""
    return {
        "type": "tool_use",
        "id": wire_id(call.id),
        "name": call.name,
        "input": json.loads(replayable_arguments(call.arguments)),
    }


def _result_block(message: ToolMessage) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": wire_id(message.tool_call_id)}
    if message.content:  # an empty text is refused; a result without content is not
        block["content"] = message.content
    if message.status is ToolStatus.ERROR:
        block["is_error"] = True
    return block


def _part_block(part: TextPart | ImagePart | FilePart, budget: PartBudget) -> dict[str, Any]:
    """One part as a content block, checked against the request's budget."""
    budget.take(part)
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    source: dict[str, Any]
    if part.url is not None:
        source = {"type": "url", "url": part.url}
    elif part.media_type == "text/plain":
        assert part.data is not None
        text = part.data.decode(errors="replace")
        source = {"type": "text", "media_type": "text/plain", "data": text}
    else:
        source = {"type": "base64", "media_type": part.media_type, "data": part.base64()}
    if isinstance(part, ImagePart):
        return {"type": "image", "source": source}
    block = {"type": "document", "source": source}
    if part.name:
        block["title"] = part.name
    return block


def _text_blocks(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}] if text else []


def wire_id(call_id: str) -> str:
    """``call_id`` as a ``tool_use`` id the API accepts (``^[a-zA-Z0-9_-]+$``).

    Ids from the API pass unchanged; another provider's (a transcript moved between
    providers) or a made-up one that the API would refuse becomes ``toolu_<digest>``, the same
    for a call and its result, so they stay paired.
    """
    if _ID_PATTERN.match(call_id):
        return call_id
    return "toolu_" + hashlib.sha256(call_id.encode()).hexdigest()[:24]


# --------------------------------------------------------------------------- tools


def to_anthropic_tools(tools: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """Convert tool specs to the API's ``tools``, each schema a sanitised copy
    (``anthropic_schema``); the caller's schemas are never modified. A tool whose schema the
    API cannot take at all is left out: ``Agent`` refuses such a tool at construction
    (``AnthropicModel.tool_schema_issues``), so only a direct caller can meet this."""
    out: list[dict[str, Any]] = []
    for spec in tools:
        converted = anthropic_schema(spec.parameters)
        if converted.fatal:
            continue
        tool: dict[str, Any] = {"name": spec.name}
        if spec.description:
            tool["description"] = spec.description
        tool["input_schema"] = converted.schema
        out.append(tool)
    return out


def to_anthropic_tool_choice(choice: str) -> dict[str, Any]:
    """``ModelRequest.tool_choice`` as the API takes it: ``auto`` and ``none`` as they are,
    ``required`` as ``any`` (call at least one), any other value as the name of the one tool
    to call. (With extended thinking on, the API accepts only ``auto`` and ``none``.)"""
    if choice in ("auto", "none"):
        return {"type": choice}
    if choice == "required":
        return {"type": "any"}
    return {"type": "tool", "name": choice}


def stub_tools(names: Iterable[str]) -> list[dict[str, Any]]:
    """Declarations for the tools a history names, for a request that offers no tools.

    The API refuses a history with tool blocks unless the request defines tools; these
    stand-ins (sent with ``tool_choice: none``, so the model cannot call them) let such a
    request through, e.g. the engine's last answer.
    """
    return [
        {
            "name": name,
            "description": "A tool of this conversation, not available now.",
            "input_schema": {"type": "object"},
        }
        for name in names
    ]


@dataclass(frozen=True, slots=True)
class SchemaProblem:
    """What the sanitised copy of a schema lost, or why there is none."""

    keyword: str
    detail: str
    fatal: bool = False


@dataclass(frozen=True, slots=True)
class ConvertedSchema:
    """A tool schema as the API takes it, and what converting it cost."""

    schema: dict[str, Any]
    problems: tuple[SchemaProblem, ...] = ()

    @property
    def fatal(self) -> bool:
        """True when the tool cannot be sent at all."""
        return any(problem.fatal for problem in self.problems)


def anthropic_schema(schema: Mapping[str, Any]) -> ConvertedSchema:
    """A copy of ``schema`` that the API takes as a tool's ``input_schema``.

    - A missing top-level ``type``, or a list of types holding ``"object"``, becomes
      ``"object"``: arguments are always an object, so this loses nothing (a top-level
      ``$ref`` stays, the API resolves it against ``$defs``).
    - Top-level ``anyOf``/``oneOf``/``allOf`` are refused by the API, so they are merged into
      the object: every branch's properties join ``properties`` (a property already there
      wins), and ``required`` gains what all the branches require (``anyOf``/``oneOf``) or any
      branch requires (``allOf``). The model is then told less about which combinations are
      valid; the tool still checks them. Reported as a non-fatal problem.
    - Any other top-level type cannot describe arguments at all: a fatal problem.

    Nothing below the top level changes.
    """
    out = copy.deepcopy(dict(schema))
    kind = out.get("type")
    if kind is None or (isinstance(kind, list) and "object" in kind):
        out["type"] = "object"
    elif kind != "object":
        detail = f"a tool's input_schema must describe an object, not {kind!r}"
        return ConvertedSchema(out, (SchemaProblem("type", detail, fatal=True),))
    problems: list[SchemaProblem] = []
    for keyword in _COMBINATORS:
        if keyword in out:
            _merge_branches(out, keyword, out.pop(keyword))
            detail = (
                f"the API refuses a top-level {keyword}: its branches' properties are merged "
                "into one object, so the model is told less about which combinations are "
                "valid (the tool still checks them)"
            )
            problems.append(SchemaProblem(keyword, detail))
    return ConvertedSchema(out, tuple(problems))


def _merge_branches(out: dict[str, Any], keyword: str, branches: object) -> None:
    own = out.get("properties")
    properties: dict[str, Any] = dict(own) if isinstance(own, Mapping) else {}
    required_sets: list[set[str]] = []
    for raw in branches if isinstance(branches, list) else []:
        branch = _resolve(out, raw)
        if branch is None:
            required_sets.append(set())
            continue
        branch_properties = branch.get("properties")
        if isinstance(branch_properties, Mapping):
            for name, sub in branch_properties.items():
                properties.setdefault(name, copy.deepcopy(sub))
        required = branch.get("required")
        required_sets.append(
            {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
        )
    if properties or isinstance(own, Mapping):
        out["properties"] = properties
    if not required_sets:
        return
    combined = (
        set().union(*required_sets) if keyword == "allOf" else set.intersection(*required_sets)
    )
    known = out.get("required")
    required = list(known) if isinstance(known, list) else []
    required += sorted(combined - set(required))
    if required:
        out["required"] = required


def _resolve(root: Mapping[str, Any], node: object) -> Mapping[str, Any] | None:
    """``node``, or the local definition its ``$ref`` names (``#/$defs/Name``), if a mapping."""
    if not isinstance(node, Mapping):
        return None
    ref = node.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return node
    target: Any = root
    for token in ref[2:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        target = target.get(token) if isinstance(target, Mapping) else None
    return target if isinstance(target, Mapping) else None
