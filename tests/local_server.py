"""An OpenAI-compatible HTTP server on 127.0.0.1 that misbehaves the way real ones do.

Built on asyncio streams (stdlib), so the SDK under test talks real HTTP/1.1 over a real
socket. Each request takes the next queued behaviour: a JSON reply, an SSE stream, a stream
that breaks off, a connection dropped without a reply, or a stall. Like llama.cpp's
``llama-server``, it can refuse a history whose tool-call arguments are not JSON
(``check_arguments``), answering HTTP 500 as that server does, and refuse a prompt longer
than its context (``context_size``) with HTTP 400.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from tests.openai_payloads import api_error, sse

Behaviour = Callable[[asyncio.StreamWriter], Awaitable[None]]
Refusal = Callable[[dict[str, str], dict[str, Any]], tuple[int, Any] | None]

ARGUMENTS_ERROR = "Failed to parse tool call arguments as JSON"
CONTEXT_ERROR = "the request exceeds the available context size, try increasing it"


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} X", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    return "\r\n".join(lines).encode()


class LocalServer:
    """``async with LocalServer() as base_url``: serves until the block ends."""

    def __init__(
        self,
        *,
        check_arguments: bool = False,
        context_size: int | None = None,
        refuse: Refusal | None = None,
        template_tokens: int = 0,
        chars_per_token: int = 3,
    ) -> None:
        self.behaviours: deque[Behaviour] = deque()
        self.refuse = refuse
        self.template_tokens = template_tokens
        """Tokens the chat template adds to every request, by this server's count."""
        self.chars_per_token = chars_per_token
        """Checks each request (headers, body) first: a (status, payload) it returns is the
        reply, as a server that refuses what it cannot take answers."""
        self.seen: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.check_arguments = check_arguments
        self.context_size = context_size
        self.counted: list[int] = []
        """Prompt tokens of each request, by the server's own count (with ``context_size``)."""
        self._server: asyncio.Server | None = None
        self._stalled = asyncio.Event()

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._stalled.set()
        self._server.close()
        await self._server.wait_closed()

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [body for _, body in self.seen]

    # ------------------------------------------------------------------ behaviours

    def reply(self, payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()

        async def send(writer: asyncio.StreamWriter) -> None:
            head = {"content-type": "application/json", "content-length": str(len(data))}
            writer.write(_head(status, {**head, **(headers or {})}) + data)

        self.behaviours.append(send)

    def raw(self, status: int, headers: dict[str, str], body: bytes) -> None:
        """Reply with exactly these bytes (a provider kit's encoding of a reply)."""

        async def send(writer: asyncio.StreamWriter) -> None:
            head = {
                k: v
                for k, v in headers.items()
                if k.lower() not in ("content-length", "transfer-encoding", "content-encoding")
            }
            head["content-length"] = str(len(body))
            writer.write(_head(status, head) + body)

        self.behaviours.append(send)

    def reply_counted(self, payload: dict[str, Any]) -> None:
        """Reply with ``payload``, its usage reporting the prompt tokens this server counted
        for the request (``context_size`` must be set), as llama-server does."""

        async def send(writer: asyncio.StreamWriter) -> None:
            prompt = self.counted[-1]
            usage = {"prompt_tokens": prompt, "completion_tokens": 10, "total_tokens": prompt + 10}
            data = json.dumps({**payload, "usage": usage}).encode()
            head = {"content-type": "application/json", "content-length": str(len(data))}
            writer.write(_head(200, head) + data)

        self.behaviours.append(send)

    def stream(self, events: list[dict[str, Any]], *, done: bool = True) -> None:
        self._stream(sse(events, done=done))

    def stream_then_reset(self, events: list[dict[str, Any]]) -> None:
        """Send the first events of a stream, then drop the connection (a server dying)."""
        self._stream(sse(events, done=False), reset=True)

    def reset(self) -> None:
        """Read the request, then close the connection without a byte of reply."""

        async def close(writer: asyncio.StreamWriter) -> None:
            transport = writer.transport
            assert isinstance(transport, asyncio.Transport)
            transport.abort()

        self.behaviours.append(close)

    def stall(self) -> None:
        """Read the request and never answer (until the server is closed)."""

        async def wait(writer: asyncio.StreamWriter) -> None:
            await self._stalled.wait()

        self.behaviours.append(wait)

    def _stream(self, body: bytes, *, reset: bool = False) -> None:
        async def send(writer: asyncio.StreamWriter) -> None:
            head = {"content-type": "text/event-stream", "transfer-encoding": "chunked"}
            writer.write(_head(200, head))
            writer.write(f"{len(body):x}\r\n".encode() + body + b"\r\n")
            await writer.drain()
            if reset:
                transport = writer.transport
                assert isinstance(transport, asyncio.Transport)
                transport.abort()
                return
            writer.write(b"0\r\n\r\n")

        self.behaviours.append(send)

    # ------------------------------------------------------------------ serving

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: the SDK reuses its connection
                try:
                    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
                    return  # the client went away, or the test's event loop is ending
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in head[1:])
                }
                body = json.loads(await reader.readexactly(int(headers.get("content-length", "0"))))
                self.seen.append((headers, body))
                if self.context_size is not None:
                    self.counted.append(
                        self.template_tokens + prompt_tokens(body, self.chars_per_token)
                    )
                refused = self.refuse(headers, body) if self.refuse is not None else None
                if refused is not None:
                    self.reply(refused[1], refused[0])
                    behaviour = self.behaviours.pop()
                elif self.context_size is not None and self.counted[-1] > self.context_size:
                    self.reply(api_error(CONTEXT_ERROR, type_="exceed_context_size_error"), 400)
                    behaviour = self.behaviours.pop()
                elif self.check_arguments and _unparseable_arguments(body):
                    self.reply(api_error(ARGUMENTS_ERROR, type_="server_error"), status=500)
                    behaviour = self.behaviours.pop()
                elif self.behaviours:
                    behaviour = self.behaviours.popleft()
                else:
                    self.reply(api_error("no reply queued", type_="server_error"), status=500)
                    behaviour = self.behaviours.pop()
                await behaviour(writer)
                if writer.transport.is_closing():
                    return
                await writer.drain()
        finally:
            writer.close()


def prompt_tokens(body: dict[str, Any], chars_per_token: int = 3) -> int:
    """The prompt's tokens as this server counts them: a chat template wraps every message
    and tool in text of its own, so it counts one token per three characters of the JSON
    sent (the engine's estimate, one per four of the text, runs about a third low)."""
    sent = json.dumps(body.get("messages", [])) + json.dumps(body.get("tools", []))
    return len(sent) // chars_per_token


def _unparseable_arguments(body: dict[str, Any]) -> bool:
    for message in body.get("messages", []):
        for call in message.get("tool_calls") or []:
            try:
                json.loads(call["function"]["arguments"])
            except ValueError:
                return True
    return False


def refused_url() -> str:
    """A base URL on 127.0.0.1 where nothing listens (the port was just free)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"
