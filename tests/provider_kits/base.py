"""A fake HTTP server for the SDKs' own clients (a mock transport), and ``OverTheWire``.

The kits implement ``agent_fsm.testing.wire.WireKit``, the public kit protocol the adapter
contract runs on (over a real socket); here they also serve the SDKs through a mock
transport, for the property harness and the adapters' own tests.

Every SDK here is built on httpx (openai before 3.x) or its successor httpx2 (openai 3.x,
anthropic 2.x, google-genai 3.x); ``http`` is the one the installed openai SDK uses (the
SDKs of one environment move together), and a kit hands its SDK an ``http.AsyncClient`` whose
``MockTransport`` is a ``FakeServer``.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agent_fsm.messages import ModelRequest, ModelResponse
from agent_fsm.models.base import Model, ModelCallError
from agent_fsm.testing.wire import WireKit, WireReply


def _sdk_http() -> Any:
    """The HTTP library the installed ``openai`` SDK is built on (its ``_base_client`` imports
    exactly one): httpx2 from openai 3.x, httpx before. Both may be installed at once (the
    lowest-versions job), so what is importable does not say which one the SDKs take."""
    from openai import _base_client

    return getattr(_base_client, "httpx2", None) or _base_client.httpx


http = _sdk_http()

__all__ = [
    "FAKE_KEY",
    "FakeServer",
    "OverTheWire",
    "WireKit",
    "as_http",
    "http",
    "sdk_target",
    "sse_body",
]

FAKE_KEY = "sk-agentfsm-SECRET-0123456789abcdef"
"""The API key every kit builds its model with: no error, event or log may contain it."""

Handler = Callable[[Any], Awaitable[Any]]


def sdk_target(where: Any, fake_base: str, prefix: str = "") -> tuple[str, Any]:
    """(base URL, HTTP client) for a kit's SDK: a URL (a ``WireServer`` on 127.0.0.1, for
    the adapter contract) with no client of its own, or an ``http.AsyncClient`` (a
    ``FakeServer``'s mock transport) under a fake base URL."""
    if isinstance(where, str):
        return where + prefix, None
    return fake_base + prefix, where


def as_http(reply: Any) -> Any:
    """A kit's ``WireReply`` as the ``http.Response`` a mock transport returns."""
    if not isinstance(reply, WireReply):
        return reply
    return http.Response(reply.status, headers=dict(reply.headers), content=reply.body)


@dataclass
class FakeServer:
    """Answers an SDK's requests from a queue of responses (or handlers) and keeps them."""

    replies: deque[Any] = field(default_factory=deque)
    requests: list[Any] = field(default_factory=list)

    def client(self) -> Any:
        return http.AsyncClient(transport=http.MockTransport(self.handle))

    def then(self, *replies: Any) -> None:
        """Queue ``http.Response``s, or async handlers of the request."""
        self.replies.extend(replies)

    def body(self, index: int = -1) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.requests[index].content)
        return result

    async def handle(self, request: Any) -> Any:
        self.requests.append(request)
        if not self.replies:
            raise AssertionError("the fake server got an unexpected request")
        reply = self.replies.popleft()
        return as_http(await reply(request) if callable(reply) else reply)


def sse_body(events: list[tuple[str | None, dict[str, Any]]], *, done: bool = False) -> bytes:
    """Server-sent events: each an (event name or None, JSON data) pair."""
    frames = []
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        frames.append(f"{head}data: {json.dumps(data)}\n\n")
    if done:
        frames.append("data: [DONE]\n\n")
    return "".join(frames).encode()


class OverTheWire:
    """A Model that answers through an adapter whose fake server asks ``inner`` for each reply.

    ``adapter.request(r)`` sends HTTP; the fake server takes the pending request ``r``, asks
    ``inner`` for its reply and encodes it with the kit, so the adapter decodes what the
    inner model said. A ``ModelCallError`` from ``inner`` goes over the wire as the HTTP error
    of its kind (429 with Retry-After, 503, or 400), ``TimeoutError`` and ``ConnectionError``
    as the transport's own, any other exception as a 400 (permanent, as the engine counts an
    unknown exception); what no ``except Exception`` catches
    (``CancelledError``, ``SystemExit``, ...) is raised into the SDK as the harness raised it.
    """

    def __init__(self, kit: WireKit, inner: Model, *, stream: bool = False) -> None:
        self.kit = kit
        self.inner = inner
        self.stream = stream
        self._pending: ModelRequest | None = None
        self._adapter = kit.build(
            http.AsyncClient(transport=http.MockTransport(self._serve)), stream=stream
        )

    @property
    def name(self) -> str:
        return f"{self.kit.name} over the wire"

    async def request(self, request: ModelRequest) -> ModelResponse:
        self._pending = request
        try:
            return await self._adapter.request(request)
        finally:
            self._pending = None

    async def _serve(self, http_request: Any) -> Any:
        assert self._pending is not None, "a request the adapter sent on its own"
        try:
            response = await self.inner.request(self._pending)
        except ModelCallError as failure:
            return self._failure(failure)
        except TimeoutError:
            raise http.ReadTimeout("the fake server stalled", request=http_request) from None
        except ConnectionError:
            raise http.ConnectError("the fake server hung up", request=http_request) from None
        except Exception as exc:
            return as_http(self.kit.error(400, f"{type(exc).__name__} in the server"))
        await asyncio.sleep(0)  # a real server is never synchronous
        return as_http(self.kit.reply(response, stream=self.stream))

    def _failure(self, failure: ModelCallError) -> Any:
        if not failure.transient:
            return as_http(self.kit.error(400, "invalid request"))
        if failure.retry_after_s is not None:
            reply = self.kit.error(429, "rate limited", retry_after=failure.retry_after_s)
            return as_http(reply)
        return as_http(self.kit.error(503, "overloaded"))
