"""What agent_fsm makes of what an MCP server sends, under ``MCPConnection`` (``agent_fsm.mcp``,
whose contracts these serve): the stream the session reads, a tool listing screened entry by
entry, structured content validated in linear time, results turned into ``ToolResult``s and
failures into one line of words. Internal to ``agent_fsm.mcp``; like it, the ``mcp`` extra.

A server is not trusted with the event loop. The SDK validates a whole ``tools/list`` result
at once, so one tool whose ``inputSchema`` is not an object would cost every tool of the
server: ``ListingScreen`` takes such entries out, one by one, before the SDK sees them, and
``MCPConnection`` reports each as skipped. The SDK validates a tool's structured content
against its ``outputSchema`` with jsonschema, whose patterns run on Python's backtracking
``re``: the server writes both, so it could freeze the loop. ``LinearSession`` validates with
``tools.patterns`` instead, against output schemas checked when the tools were offered.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import io
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import anyio
import mcp.types as mcp_types
from jsonschema.protocols import Validator
from mcp import ClientSession, MCPError
from mcp_types import methods
from pydantic import JsonValue, ValidationError

from agent_fsm.content import FilePart, ImagePart
from agent_fsm.failures import describe
from agent_fsm.tools.results import ToolResult

__all__ = [
    "Inbound",
    "LinearSession",
    "Listing",
    "ListingScreen",
    "handshake",
    "reason",
    "server_stderr",
    "to_tool_result",
]


@dataclass(frozen=True, slots=True)
class Listing:
    """What the handshake and the tool listing found."""

    server_name: str
    tools: list[mcp_types.Tool]


async def handshake(session: ClientSession) -> Listing:
    """Initialize the session and list every tool, page by page."""
    initialized = await session.initialize()
    tools: list[mcp_types.Tool] = []
    if initialized.capabilities.tools is not None:
        cursor: str | None = None
        while True:
            params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
    return Listing(server_name=initialized.server_info.name, tools=tools)


def server_stderr(given: TextIO | None, stack: contextlib.AsyncExitStack) -> TextIO:
    """Where a stdio server's stderr goes: ``given``, else ours when it is a real file (a
    subprocess needs a file descriptor; pytest's capsys and notebooks may give none), else
    nowhere."""
    if given is not None:
        return given
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return stack.enter_context(open(os.devnull, "w"))
    return sys.stderr


class ListingScreen:
    """Takes out of a ``tools/list`` result each tool the SDK would refuse, so that it costs
    only itself, and says why in ``refused`` (by the server's name for it, in listing order).

    Each entry is validated as the SDK validates the whole result (``mcp_types.methods``, for
    the protocol version the handshake settled), inside the result's own envelope. An
    envelope that is itself invalid is left alone: the SDK refuses it, and the connection
    fails saying why. Before the version is known nothing is screened.
    """

    def __init__(self) -> None:
        self.version: str | None = None
        self.refused: dict[str, str] = {}

    def screen(self, item: Any) -> Any:
        """``item`` as read from the stream, or, for a tool listing with entries the SDK
        would refuse, a copy without them. Must not raise: it runs inside the SDK's reader."""
        message = getattr(item, "message", None)
        if not isinstance(message, mcp_types.JSONRPCResponse) or not isinstance(
            message.result, dict
        ):
            return item
        result = message.result
        version = result.get("protocolVersion")
        if isinstance(version, str) and "serverInfo" in result:
            self.version = version
            return item
        listed = result.get("tools")
        if self.version is None or not isinstance(listed, list) or self._invalid(result, []):
            return item
        kept = []
        for index, entry in enumerate(listed):
            problem = self._invalid(result, [entry])
            if problem is None:
                kept.append(entry)
                continue
            name = entry.get("name") if isinstance(entry, dict) else None
            shown = name if isinstance(name, str) else f"(entry {index} of the listing)"
            self.refused[shown] = f"its listing is not valid MCP ({problem})"
        if len(kept) == len(listed):
            return item
        screened = message.model_copy(update={"result": {**result, "tools": kept}})
        return dataclasses.replace(item, message=screened)

    def _invalid(self, result: dict[str, Any], tools: list[Any]) -> str | None:
        """What the SDK would find wrong with ``result`` listing only ``tools``, or None."""
        assert self.version is not None
        try:
            methods.validate_server_result("tools/list", self.version, {**result, "tools": tools})
        except ValidationError as exc:
            return _first_problem(exc, skip=2)  # the path inside the entry: tools.0.<here>
        except Exception:  # a version the SDK does not know: it decides, as it would
            return None
        return None


class LinearSession(ClientSession):
    """The SDK's session, validating a tool's structured content with agent_fsm's validator
    (patterns in linear time) against the output schemas in ``output_validators``, which the
    connection fills when it offers the tools. A tool with none there has nothing checked:
    it had no output schema, or was not offered."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.output_validators: dict[str, Validator] = {}

    async def validate_tool_result(self, name: str, result: mcp_types.CallToolResult) -> None:
        """As the SDK's: raises ``RuntimeError`` for missing or invalid structured content."""
        validator = self.output_validators.get(name)
        if validator is None:
            return
        content = result.structured_content
        if content is None and "structured_content" not in result.model_fields_set:
            raise RuntimeError(f"tool {name} has an output schema but sent no structured content")
        try:
            errors = list(validator.iter_errors(content))
        except RecursionError:
            raise RuntimeError(
                f"the structured content of tool {name} is nested too deeply"
            ) from None
        if errors:
            where = "/".join(str(p) for p in errors[0].absolute_path) or "(root)"
            raise RuntimeError(
                f"tool {name} sent structured content its output schema refuses, at {where}: "
                f"{errors[0].message}"
            )


class Inbound:
    """The transport's read stream, as the session reads it, with two jobs.

    It calls ``on_end`` when the stream ends: the server closed the connection (a stdio
    server that exited). The SDK fails the calls in flight then, but holds the dead
    connection until it is closed; this lets the owner task close it at once, and later calls
    say why without trying. And it passes every message through ``screen`` (a tool listing
    loses the entries the SDK would refuse, see ``ListingScreen``).
    """

    def __init__(self, stream: Any, on_end: Callable[[], None], screen: ListingScreen) -> None:
        self._stream = stream
        self._on_end = on_end
        self._screen = screen

    def __getattr__(self, name: str) -> Any:  # last_context, on the HTTP transport's stream
        return getattr(self._stream, name)

    async def receive(self) -> Any:
        try:
            item = await self._stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._on_end()
            raise
        return self._screen.screen(item)

    def __aiter__(self) -> Inbound:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> Inbound:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def reason(exc: BaseException) -> str:
    """A failure in one line: the first exception that is not a cancellation, found inside
    exception groups (the transports' task groups wrap what went wrong)."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if not isinstance(inner, asyncio.CancelledError):
                return reason(inner)
    if isinstance(exc, MCPError):
        return f"{exc.message} (MCP error {exc.code})"
    if isinstance(exc, ValidationError):
        return f"the server sent what is not valid MCP ({_first_problem(exc)})"
    return _described_with_cause(exc)


def _described_with_cause(exc: BaseException) -> str:
    """``describe(exc)``; for an exception with no message of its own ("ReadError"), the
    first message found among its causes, after its name."""
    said = describe(exc)
    cause = exc.__cause__ or exc.__context__
    seen = {id(exc)}
    while said == type(exc).__name__ and cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if describe(cause) != type(cause).__name__:
            return f"{said} ({describe(cause)})"
        cause = cause.__cause__ or cause.__context__
    return said


def _first_problem(exc: ValidationError, *, skip: int = 0) -> str:
    """Where the first problem of a pydantic error is (less ``skip`` leading steps), and what
    it is, in one line."""
    problems = exc.errors(include_url=False)
    if not problems:
        return str(exc)
    where = ".".join(str(part) for part in problems[0]["loc"][skip:])
    return f"{where}: {problems[0]['msg']}" if where else problems[0]["msg"]


def _size(base64_text: str) -> int:
    """Bytes encoded by ``base64_text``, without decoding it."""
    return len(base64_text.rstrip("=")) * 3 // 4


def _read_for_the_model(block: Any) -> tuple[str, bool]:
    """What the model reads of one content block, and whether the block itself must be kept
    in the details because the model cannot read it (images, audio, binary resources)."""
    if isinstance(block, mcp_types.TextContent):
        return block.text, False
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        kind = "image" if isinstance(block, mcp_types.ImageContent) else "audio"
        return f"[{kind} {block.mime_type}, {_size(block.data)} bytes: not shown to you]", True
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, mcp_types.TextResourceContents):
            return f"[resource {resource.uri}]\n{resource.text}", False
        size = _size(resource.blob) if isinstance(resource, mcp_types.BlobResourceContents) else 0
        return f"[resource {resource.uri}, {size} bytes: not shown to you]", True
    if isinstance(block, mcp_types.ResourceLink):
        return f"[resource link {block.name}: {block.uri}]", True
    return f"[{getattr(block, 'type', 'unknown')} content: not shown to you]", True


SHOWN_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/webp"})
"""The image types every adapter's provider reads: an MCP image of one of them goes to the
model as an ``ImagePart``; one of another type stays a note (and in the details), since a
part the provider cannot take would fail the next model call."""


def _shown(block: Any) -> ImagePart | FilePart | None:
    """The part the model is shown for an image or a PDF resource; None for other blocks."""
    try:
        if isinstance(block, mcp_types.ImageContent) and block.mime_type in SHOWN_IMAGE_TYPES:
            return ImagePart(
                data=base64.b64decode(block.data, validate=True), media_type=block.mime_type
            )
        if (
            isinstance(block, mcp_types.EmbeddedResource)
            and isinstance(block.resource, mcp_types.BlobResourceContents)
            and block.resource.mime_type == "application/pdf"
        ):
            name = str(block.resource.uri).rstrip("/").rpartition("/")[2] or None
            data = base64.b64decode(block.resource.blob, validate=True)
            return FilePart(data=data, media_type="application/pdf", name=name)
    except ValueError:  # not base64: a note, as for what the model cannot read
        return None
    return None


def to_tool_result(server: str, tool: str, result: mcp_types.CallToolResult) -> ToolResult:
    """A ``CallToolResult`` as agent_fsm answers it: text for the model, images (PNG, JPEG,
    WebP) and PDF resources as parts it is shown after the text, the rest in details.

    ``details`` holds ``server`` and ``tool`` (the server's own name for it), and, when there
    are any, ``structured_content`` and ``content`` (the blocks the model cannot read, as the
    server sent them).
    """
    texts: list[str] = []
    kept: list[JsonValue] = []
    parts: list[ImagePart | FilePart] = []
    for block in result.content:
        part = _shown(block)
        if part is not None:
            parts.append(part)
            continue
        text, keep = _read_for_the_model(block)
        texts.append(text)
        if keep:
            kept.append(block.model_dump(mode="json", by_alias=True, exclude_none=True))
    structured = result.structured_content
    output = "\n".join(texts)
    if not texts and structured is not None:
        output = json.dumps(structured, ensure_ascii=False)
    details: dict[str, JsonValue] = {"server": server, "tool": tool}
    if structured is not None:
        details["structured_content"] = structured
    if kept:
        details["content"] = kept
    if not output and parts:
        output = f"(the tool returned {len(parts)} image(s) or file(s))"
    return ToolResult(
        output or "(the tool returned no content)", details, result.is_error, parts=parts
    )
