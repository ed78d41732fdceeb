"""``SDKModel``: what every SDK adapter does alike, so that each adapter is its conversion.

An adapter is two things (STYLE 14): the *provider* side, which is the same for every SDK
(a client built lazily per event loop with the SDK's retries off, credentials kept out of
every error, error classification into ``ModelCallError``, reading a whole reply or a stream,
closing), and the *wire conversion*, which is its own. ``SDKModel`` is the first; an adapter
subclasses it and fills these hooks with its SDK:

=======================  ===========================================================
hook                     what the adapter supplies
=======================  ===========================================================
``_new_client``          its SDK client, built from ``api_key``/``base_url``, no retries
``_without_retries``     a given client as a copy with the SDK's retries off
``_close_client``        how to close a client it built
``_client_secrets``      the credentials a client holds, scrubbed from every error
``_attempt``             where a request goes and under which timeout (for messages)
``_convert_tools``       the tools in its wire format (cached while the tuple is the same)
``_call``                one request's arguments for the SDK: the wire conversion
``_reader``              a fresh ``ReplyReader`` for one request's reply
``_send``                the SDK call (whole, or opening a stream)
``_classify``            an SDK exception as a ``ModelCallError``: transient or not, delay
=======================  ===========================================================

and, when it needs them, ``_check_client`` (a client that cannot authenticate),
``_continuation`` (a reply that takes another request to finish) and ``_repr_options``.

Retrying is the engine's job (its THINK → THINK row, bounded by the consecutive-error guard,
with backoff honouring ``retry_after_s``), so no client is ever used with the SDK's own
retries: they would be invisible to the budgets. No SDK is imported here: each adapter stays
the only importer of its own.
"""

from __future__ import annotations

import asyncio
import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from agent_fsm.errors import ConfigError
from agent_fsm.messages import ModelRequest, ModelResponse, ReplyDelta, ToolSpec
from agent_fsm.models.base import ModelCallError
from agent_fsm.models.common import (
    Attempt,
    ClosesOnExit,
    DeltaReporter,
    check_adapter_options,
    context_overflow,
    redact_url,
    scrub_secrets,
)

__all__ = ["ReplyReader", "SDKModel", "close_stream"]

ClientT = TypeVar("ClientT")
ToolsT = TypeVar("ToolsT")


class ReplyReader(Protocol):
    """Builds one ``ModelResponse`` from an SDK's reply objects, given whole or streamed.

    Both paths must give the same response for the same reply: the engine cannot tell a
    streamed turn from a whole one. A reader is made for one request and used once.
    """

    def add_reply(self, reply: object) -> None:
        """Add a whole (not streamed) reply.

        Raises:
            ModelCallError: transient when the reply is malformed; as the reply says when it
                reports a failure of its own.
        """
        ...

    def add_event(self, event: object) -> Iterable[ReplyDelta]:
        """Add one streamed event (chunk); return the fragments to report, in order.

        Raises:
            ModelCallError: as ``add_reply``.
        """
        ...

    def end_stream(self) -> None:
        """The stream ended without a transport failure. A reader whose reply comes in
        parts checks here that the part was complete; by default ``build`` checks it."""
        return

    def build(self) -> ModelResponse:
        """The assembled response.

        Raises:
            ModelCallError: transient when the reply is incomplete: a stream cut before its
                final event looks complete otherwise, and its text must not become an
                answer.
        """
        ...


async def close_stream(stream: object) -> None:
    """Release a stream's connection, however its reading ended: ``aclose()`` for an async
    generator (google-genai), else ``close()`` (the openai and anthropic ``AsyncStream``)."""
    for name in ("aclose", "close"):
        method = getattr(stream, name, None)
        if method is not None:
            result = method()
            if inspect.isawaitable(result):
                await result
            return


class SDKModel(ClosesOnExit, ABC, Generic[ClientT, ToolsT]):
    """The base of the SDK adapters: a ``Model`` whose subclasses supply only their SDK's
    client and the wire conversion (see the module docstring for the hooks).

    A client built here belongs to the event loop of its first request; a request from
    another loop (successive ``asyncio.run`` calls) gets a fresh one, since pooled
    connections cannot cross loops. ``aclose()`` (or ``async with model:``) closes it and the
    adapter stays usable; a client the caller gave is used as a copy without retries and
    never closed here: its owner closes it.

    Every failure leaves ``request`` as a ``ModelCallError`` whose text has had the
    credentials taken out and that has no chained cause or context, because an SDK's
    exceptions can carry text that contains the key.

    Args:
        model: the model name sent to the server.
        base_url: the API root; None keeps the SDK's (and its environment variable).
        api_key: the key; None lets the SDK read its environment variable.
        client: a ready SDK client instead (then ``base_url`` and ``api_key`` must be None).
        stream: stream replies, reporting fragments to ``ModelRequest.on_delta``.
        timeout: seconds allowed for one request (checked here; each adapter sends it).
        context_window: the model's context window in tokens, for ``Agent``; None if unknown.

    Raises:
        ConfigError: see ``common.check_adapter_options``.
    """

    label: ClassVar[str]
    """The SDK's name in messages: "cannot build the <label> client"."""
    example: ClassVar[str]
    """A model name for the message that asks for one."""
    key_hint: ClassVar[str] = ""
    """Where a missing key goes, added to the message when the client cannot be built."""
    client_errors: ClassVar[tuple[type[Exception], ...]] = (Exception,)
    """What building the client raises when it cannot be built (no key, bad options)."""
    sdk_errors: ClassVar[tuple[type[Exception], ...]] = (Exception,)
    """What the SDK call raises for a failure; ``_classify`` reads each."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None,
        api_key: str | None,
        client: ClientT | None,
        stream: bool,
        timeout: float | None,
        context_window: int | None,
    ) -> None:
        check_adapter_options(
            type(self).__name__,
            self.example,
            model,
            client=client,
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            context_window=context_window,
        )
        self.context_window = context_window
        """The model's context window in tokens (a local server's context size), which
        ``Agent`` takes when its ``Limits`` name none."""
        self._model = model
        self._base_url = base_url
        self._api_key = api_key
        self._stream = stream
        self._settings: Mapping[str, Any] = MappingProxyType({})
        self._given_client = self._without_retries(client) if client is not None else None
        self._own_client: ClientT | None = None
        self._own_loop: asyncio.AbstractEventLoop | None = None
        self._tools_cache: tuple[tuple[ToolSpec, ...], ToolsT] | None = None

    @property
    def name(self) -> str:
        """The model name, as sent to the server."""
        return self._model

    def __repr__(self) -> str:
        parts = [repr(self._model)]
        if self._base_url is not None:
            parts.append(f"base_url={redact_url(self._base_url)!r}")
        parts.append(f"stream={self._stream}")
        parts += self._repr_options()
        if self._settings:
            parts.append(f"settings={sorted(self._settings)}")  # names only: values may be secret
        return f"{type(self).__name__}({', '.join(parts)})"

    async def request(self, request: ModelRequest) -> ModelResponse:
        """Send one request (more, while ``_continuation`` asks for them) and convert the
        reply.

        Raises:
            ModelCallError: for every failure of the client, the server, the network or the
                reply, scrubbed and never chained.
        """
        client = self._ready_client()
        call = self._call(request)
        reader = self._reader(request)
        attempt = self._attempt(client)
        report = DeltaReporter(request.on_delta, request.run_id)
        part = 0
        while True:
            await self._exchange(client, call, reader, report, attempt)
            follow = self._continuation(call, reader, part)
            if follow is None:
                break
            call, part = follow, part + 1
        try:
            return reader.build()
        except ModelCallError as err:
            failure = self._rescrubbed(err)
        raise failure  # outside the except block: no __context__ links to the reply

    async def aclose(self) -> None:
        """Close the client this adapter built, if any; a given ``client`` is left open.

        The adapter stays usable: the next request builds a new client.
        """
        client, self._own_client, self._own_loop = self._own_client, None, None
        if client is not None:
            await self._close_client(client)

    # -- hooks every adapter fills

    @abstractmethod
    def _new_client(self) -> ClientT:
        """A client from ``self._api_key`` and ``self._base_url``, with no retries."""

    @abstractmethod
    def _without_retries(self, client: ClientT) -> ClientT:
        """``client`` as the adapter uses it: without the SDK's own retries."""

    @abstractmethod
    async def _close_client(self, client: ClientT) -> None:
        """Close a client this adapter built."""

    @abstractmethod
    def _client_secrets(self, client: ClientT) -> Iterable[object]:
        """The credentials ``client`` holds (None for those it has not)."""

    @abstractmethod
    def _attempt(self, client: ClientT) -> Attempt:
        """Where the request goes (credentials taken out) and the timeout in force."""

    @abstractmethod
    def _convert_tools(self, tools: tuple[ToolSpec, ...]) -> ToolsT:
        """The tools in the provider's wire format."""

    @abstractmethod
    def _call(self, request: ModelRequest) -> dict[str, Any]:
        """The SDK call's arguments for ``request``: the transcript, tools, settings."""

    @abstractmethod
    def _reader(self, request: ModelRequest) -> ReplyReader:
        """A fresh reader for the reply to ``request``."""

    @abstractmethod
    def _send(self, client: ClientT, call: dict[str, Any]) -> Awaitable[Any]:
        """The SDK call: a whole reply, or with ``self._stream`` an async iterable stream."""

    @abstractmethod
    def _classify(self, err: Exception, attempt: Attempt) -> ModelCallError:
        """What ``err`` (one of ``sdk_errors``, or raised by a stream) means: its message,
        whether retrying can help, the delay the server asked for. Scrubbing is done after."""

    # -- hooks with a default

    def _check_client(self, client: ClientT) -> ModelCallError | None:
        """A permanent failure when ``client`` cannot make a request at all; None if it can."""
        return None

    def _continuation(
        self, call: dict[str, Any], reader: ReplyReader, part: int
    ) -> dict[str, Any] | None:
        """The call that continues the reply after part ``part`` (from 0); None: it is done."""
        return None

    def _repr_options(self) -> Sequence[str]:
        """The adapter's own options for its repr, e.g. ``["strict=True"]``."""
        return ()

    # -- the shared plumbing

    def _check_credentials(self) -> None:
        """Build the client once, as the first request would, and drop it: a missing key (or
        any client option the SDK refuses) is a configuration mistake, found when the adapter
        is built rather than at the first call. Each adapter calls this last in its
        ``__init__``, once its own options are checked and stored. Building a client opens
        no connection; a given ``client`` is not checked (its owner built it).

        Raises:
            ConfigError: saying what the SDK refused, and where a key goes.
        """
        if self._given_client is None:
            try:
                self._checked(self._new_client)
            except ModelCallError as err:
                raise ConfigError(str(err)) from None

    def _client(self) -> ClientT:
        if self._given_client is not None:
            return self._given_client
        loop = asyncio.get_running_loop()
        if self._own_client is None or self._own_loop is not loop:
            self._own_client = self._new_client()
            self._own_loop = loop
        return self._own_client

    def _ready_client(self) -> ClientT:
        return self._checked(self._client)

    def _checked(self, build: Callable[[], ClientT]) -> ClientT:
        """The client ``build`` makes, if it can make a request; else a permanent
        ``ModelCallError`` saying why (scrubbed, not chained to the SDK's error)."""
        failure: ModelCallError | None
        try:
            client = build()
        except self.client_errors as err:  # e.g. no key given and none in the environment
            hint = f" ({self.key_hint})" if self.key_hint else ""
            message = self._scrub(f"cannot build the {self.label} client: {err}{hint}")
            failure = ModelCallError(message, transient=False)
        else:
            failure = self._check_client(client)
        if failure is not None:
            raise failure  # outside the except block: no __context__ links to the SDK error
        return client

    def _wire_tools(self, tools: tuple[ToolSpec, ...]) -> ToolsT:
        # The engine sends the same tuple every turn: convert (and sanitise) it once.
        cached = self._tools_cache
        if cached is not None and cached[0] is tools:
            return cached[1]
        wire = self._convert_tools(tools)
        self._tools_cache = (tools, wire)
        return wire

    async def _exchange(
        self,
        client: ClientT,
        call: dict[str, Any],
        reader: ReplyReader,
        report: DeltaReporter,
        attempt: Attempt,
    ) -> None:
        """One request and its reply, into ``reader``."""
        failure: ModelCallError | None = None
        try:
            sent = await self._send(client, call)
        except self.sdk_errors as err:
            failure = self._failure(err, attempt)
        if failure is not None:
            raise failure
        if self._stream:
            failure = await self._read_stream(sent, reader, report, attempt)
        else:
            try:
                reader.add_reply(sent)
            except ModelCallError as err:
                failure = self._rescrubbed(err)
        if failure is not None:
            raise failure

    async def _read_stream(
        self, stream: Any, reader: ReplyReader, report: DeltaReporter, attempt: Attempt
    ) -> ModelCallError | None:
        """Read ``stream`` into ``reader``, reporting fragments as they come; the stream is
        closed however the reading ends (cancellation included)."""
        failure: ModelCallError | None = None
        events = stream.__aiter__()
        try:
            while failure is None:
                try:
                    event = await events.__anext__()
                except StopAsyncIteration:
                    break
                except Exception as err:  # the SDK's iterator: error events, transport, decoding
                    failure = self._failure(err, attempt, streaming=True)
                    break
                try:
                    for delta in reader.add_event(event):
                        report(delta)
                except ModelCallError as err:
                    failure = self._rescrubbed(err)
        finally:
            await close_stream(stream)
        if failure is None:
            try:
                reader.end_stream()
            except ModelCallError as err:
                failure = self._rescrubbed(err)
        return failure

    def _failure(
        self, err: Exception, attempt: Attempt, *, streaming: bool = False
    ) -> ModelCallError:
        """``err`` as a ModelCallError (scrubbed, never chained) that says what failed,
        where, and after how long."""
        prefix = "while streaming: " if streaming else ""
        return self._rescrubbed(self._classify(err, attempt), prefix)

    def _rescrubbed(self, err: ModelCallError, prefix: str = "") -> ModelCallError:
        """A fresh copy of ``err`` with the credentials taken out: a reply's own text (a
        finish message, an error event) can quote them. A permanent failure whose text says
        the prompt was longer than the context is a ``context_overflow`` (every adapter's
        failures pass here, so each provider's wording is read the same way)."""
        overflow, size = err.context_overflow, err.prompt_tokens
        if not overflow and not err.transient:
            overflow, size = context_overflow(str(err))
        return ModelCallError(
            self._scrub(prefix + str(err)),
            transient=err.transient,
            retry_after_s=err.retry_after_s,
            context_overflow=overflow,
            prompt_tokens=size,
        )

    def _scrub(self, text: str) -> str:
        secrets: set[object] = {self._api_key}
        for client in (self._given_client, self._own_client):
            if client is not None:
                secrets.update(self._client_secrets(client))
        return scrub_secrets(text, secrets)
