"""A provider's wire format from the server's side (``WireKit``), and a server on 127.0.0.1
that speaks it (``WireServer``): what the model-adapter contract
(``agent_fsm.testing.adapter_contract``) runs an adapter against.

A kit encodes a provider-neutral ``ModelResponse`` as the bytes the real API sends for it
(whole, or as a stream), an error the way the API reports errors, and reads back what the
adapter sent. The adapter under test talks real HTTP/1.1 to ``WireServer`` over a socket,
through its own SDK, so one scenario checks its conversions both ways and its handling of
the transport (dropped connections, streams cut short, stalls and cancellation). Nothing
here imports an SDK or an HTTP library: the server is asyncio streams.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, Self, runtime_checkable

from agent_fsm.messages import FinishReason, ModelResponse
from agent_fsm.models.base import Model

__all__ = ["SeenRequest", "WireKit", "WireReply", "WireServer"]

_FRAME_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


@dataclass(frozen=True, slots=True)
class WireReply:
    """One HTTP response, as bytes on the wire."""

    status: int
    """The HTTP status."""
    headers: Mapping[str, str]
    """Its headers (``content-length`` and ``transfer-encoding`` are the server's to set)."""
    body: bytes
    """Its body: JSON, or server-sent events for a stream."""

    @classmethod
    def json(
        cls, payload: object, *, status: int = 200, headers: Mapping[str, str] | None = None
    ) -> Self:
        """A JSON body (``application/json``)."""
        head = {"content-type": "application/json", **(headers or {})}
        return cls(status, head, json.dumps(payload).encode())

    @classmethod
    def events(cls, body: bytes, *, headers: Mapping[str, str] | None = None) -> Self:
        """A stream of server-sent events (``text/event-stream``), with status 200."""
        return cls(200, {"content-type": "text/event-stream", **(headers or {})}, body)

    def frames(self) -> list[bytes]:
        """The body's server-sent events, each with its blank line, in order."""
        frames, start = [], 0
        for end in _FRAME_END.finditer(self.body):
            frames.append(self.body[start : end.end()])
            start = end.end()
        if start < len(self.body):
            frames.append(self.body[start:])
        return frames


@runtime_checkable
class WireKit(Protocol):
    """A provider's wire format, from the server's side: what a contract needs to know to
    serve an adapter (see ``tests/provider_kits/`` in agent_fsm's repository for four)."""

    name: str
    """The provider's name, for test ids and messages, e.g. ``"anthropic"``."""
    finish_reasons: frozenset[FinishReason]
    """The finish reasons the wire can express (Anthropic has no content filter stop,
    Gemini no refusal); the contract skips the others."""
    can_omit_usage: bool
    """Whether a reply can come without usage (False: the API always reports it)."""
    carries_raw_arguments: bool
    """Whether tool-call arguments travel as text that may not be JSON (True), or as an
    object that always is (False: Gemini)."""

    def build(self, base_url: str, *, api_key: str, stream: bool = False) -> Model:
        """The adapter under test, talking to ``base_url`` (``http://127.0.0.1:PORT``, the
        kit adds any path prefix its SDK expects, e.g. ``/v1``) with ``api_key``, the
        SDK's own retries off as every adapter must have them."""
        ...

    def reply(self, response: ModelResponse, *, stream: bool = False) -> WireReply:
        """What the real API sends for ``response``: its text, tool calls (ids, names and
        argument text as given), finish reason and usage (input, output, cached and
        reasoning tokens; the API's own form, e.g. cached apart or included) in the
        provider's own form. Streamed, text and arguments are cut into several events and
        the finish reason comes last."""
        ...

    def error(self, status: int, message: str, *, retry_after: float | None = None) -> WireReply:
        """What the real API sends for a failure with this status; with ``retry_after``,
        the delay the server asks for, the way the API says it (a header, a body field)."""
        ...

    def tool_results(self, body: dict[str, Any]) -> list[tuple[str, str]]:
        """The tool results a request body carries, in order, as (call id, text); a provider
        without call ids gives the tool name instead."""
        ...

    def system_prompt(self, body: dict[str, Any]) -> str | None:
        """The system prompt a request body carries, wherever the provider puts it."""
        ...


@dataclass(frozen=True, slots=True)
class SeenRequest:
    """A request the server read."""

    method: str
    path: str
    """The path with its query, e.g. ``/v1/chat/completions``."""
    headers: Mapping[str, str]
    """Its headers, names in lower case."""
    body: Any
    """Its body, parsed as JSON (None when empty)."""


_Behaviour = Callable[[asyncio.StreamWriter], Awaitable[None]]


class WireServer:
    """``async with WireServer() as url``: an HTTP/1.1 server on 127.0.0.1 that answers each
    request with the next queued behaviour, and keeps what it was sent (``requests``).

    Behaviours: ``then(reply, ...)`` answers with a ``WireReply``; ``cut(reply)`` sends the
    first half of a stream's events and then drops the connection (``drop=True``, a server
    dying) or ends the stream cleanly (``drop=False``, a proxy closing early); ``stall()``
    never answers; ``stall_after(reply)`` sends the head and the first event of a stream,
    then nothing. A request with nothing queued gets HTTP 500 and fails the test that looks.
    """

    def __init__(self) -> None:
        self.requests: list[SeenRequest] = []
        """Every request read, in order."""
        self._queue: deque[_Behaviour] = deque()
        self._server: asyncio.Server | None = None
        self._closing = asyncio.Event()
        self._arrived = asyncio.Condition()

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._closing.set()
        self._server.close()
        await self._server.wait_closed()

    def body(self, index: int = -1) -> Any:
        """The JSON body of a request the server read (the last by default)."""
        return self.requests[index].body

    async def received(self, count: int) -> None:
        """Wait until the server has read ``count`` requests."""
        async with self._arrived:
            await self._arrived.wait_for(lambda: len(self.requests) >= count)

    # -- behaviours

    def then(self, *replies: WireReply) -> None:
        """Answer the next requests with ``replies``, in order."""
        for reply in replies:
            self._queue.append(functools.partial(_send, reply=reply))

    def cut(self, reply: WireReply, *, drop: bool = True) -> None:
        """Send the first half of the events of the stream ``reply`` (at least one), then
        drop the connection (``drop``) or end the body there as if it were complete."""
        frames = reply.frames()
        part = b"".join(frames[: max(1, len(frames) // 2)])

        async def send(writer: asyncio.StreamWriter) -> None:
            await _send(writer, reply, part, chunked=True, end=not drop)
            if drop:
                _abort(writer)

        self._queue.append(send)

    def stall(self) -> None:
        """Read the request and never answer (until the server closes)."""

        async def wait(writer: asyncio.StreamWriter) -> None:
            await self._closing.wait()

        self._queue.append(wait)

    def stall_after(self, reply: WireReply) -> None:
        """Send the head and the first event of the stream ``reply``, then nothing more."""
        first = reply.frames()[0]

        async def send(writer: asyncio.StreamWriter) -> None:
            await _send(writer, reply, first, chunked=True, end=False)
            await self._closing.wait()

        self._queue.append(send)

    # -- serving

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: SDKs reuse their connection
                try:
                    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                    method, path, _ = head[0].split(" ", 2)
                    headers = {
                        k.strip().lower(): v.strip()
                        for k, _, v in (line.partition(":") for line in head[1:] if line)
                    }
                    raw = await reader.readexactly(int(headers.get("content-length", "0")))
                except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
                    return  # the client went away, or the event loop is ending
                async with self._arrived:
                    self.requests.append(
                        SeenRequest(method, path, headers, json.loads(raw) if raw else None)
                    )
                    self._arrived.notify_all()
                if self._queue:
                    await self._queue.popleft()(writer)
                else:
                    await _send(writer, WireReply.json({"error": "nothing queued"}, status=500))
                if writer.transport.is_closing():
                    return
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            writer.close()


async def _send(
    writer: asyncio.StreamWriter,
    reply: WireReply,
    body: bytes | None = None,
    *,
    chunked: bool = False,
    end: bool = True,
) -> None:
    data = reply.body if body is None else body
    headers = {
        k: v
        for k, v in reply.headers.items()
        if k.lower() not in ("content-length", "transfer-encoding", "content-encoding")
    }
    if chunked:
        headers["transfer-encoding"] = "chunked"
        payload = f"{len(data):x}\r\n".encode() + data + b"\r\n" + (b"0\r\n\r\n" if end else b"")
    else:
        headers["content-length"] = str(len(data))
        payload = data
    lines = [f"HTTP/1.1 {reply.status} X", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    writer.write("\r\n".join(lines).encode() + payload)
    await writer.drain()


def _abort(writer: asyncio.StreamWriter) -> None:
    transport = writer.transport
    assert isinstance(transport, asyncio.Transport)
    transport.abort()
