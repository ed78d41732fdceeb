"""The Anthropic Messages adapter: the only module in agent_fsm that imports ``anthropic``.

It speaks ``POST /v1/messages`` through the ``anthropic`` SDK (the optional extra
``agent-fsm[anthropic]``). The transcript and tool conversion lives in ``anthropic_convert``,
the reading of replies (stop reasons, usage, streams) in ``anthropic_reply``; this module owns
the SDK client, the request, the continuation of paused turns and the mapping of failures to
``ModelCallError``.

Retrying is the engine's job (its THINK → THINK row, bounded by the consecutive-error guard,
with backoff honouring ``retry_after_s``), so the SDK client is always used with
``max_retries=0``: retries hidden in here would be invisible to the budgets.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import inspect
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import anthropic

from agent_fsm.errors import ConfigError
from agent_fsm.messages import ModelRequest, ModelResponse, ToolSpec
from agent_fsm.models.anthropic_convert import (
    PROVIDER,
    anthropic_schema,
    stub_tools,
    to_anthropic_prompt,
    to_anthropic_tool_choice,
    to_anthropic_tools,
)
from agent_fsm.models.anthropic_reply import AnthropicReply
from agent_fsm.models.base import ModelCallError, ToolSchemaIssue
from agent_fsm.models.common import (
    Attempt,
    ClosesOnExit,
    DeltaReporter,
    check_adapter_options,
    one_line,
    parse_retry_after,
    redact_url,
    scrub_secrets,
    transport_failure,
)

__all__ = ["DEFAULT_MAX_TOKENS", "MAX_CONTINUATIONS", "AnthropicModel"]

DEFAULT_MAX_TOKENS = 4096
"""The reply cap sent when none is given. The API requires one; 4096 is the largest every
Claude model accepts (the Claude 3 models cap their output there), so the default never turns
into an HTTP 400, and it is ample for a tool-calling turn. Long answers or extended thinking
(whose ``budget_tokens`` must stay below it) want ``max_tokens=`` set."""

MAX_CONTINUATIONS = 4
"""How many times one model call sends a ``pause_turn`` reply back to let the turn go on
(see ``anthropic_reply``), each a request of its own; a turn still paused then ends as
``FinishReason.LENGTH``."""

# Request fields the adapter sets itself; a setting may not override them.
_RESERVED = frozenset({"messages", "model", "system", "tools", "stream", "max_tokens"})
# Settings that only mean something when tools are offered (the API rejects them otherwise).
_TOOL_SETTINGS = ("tool_choice",)
# Sampling fields that API version 2026-10-21 (the SDK's default since 2.0) refuses.
_SAMPLING = frozenset({"temperature", "top_p", "top_k"})
_TRANSIENT_STATUSES = frozenset({408, 409, 429})
# Error types that say retrying cannot help, for an error event inside a 200 stream.
_PERMANENT_TYPES = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "billing_error",
    }
)
_KEY_HINT = "pass api_key= or client=, or set ANTHROPIC_API_KEY"


@functools.cache
def _create_parameters() -> frozenset[str] | None:
    """Names ``messages.create`` accepts, or None if they cannot be read."""
    try:
        create = anthropic.resources.messages.AsyncMessages.create
        return frozenset(inspect.signature(create).parameters) - {"self"}
    except (AttributeError, TypeError, ValueError):  # pragma: no cover - unusual SDK builds
        return None


class AnthropicModel(ClosesOnExit):
    """A Model backed by the Anthropic Messages API (``POST /v1/messages``).

    The SDK client is built on first use, from ``api_key`` and ``base_url`` or, when they are
    None, from ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL`` exactly as the SDK reads them.
    A client built here belongs to the event loop of its first request; a request from another
    loop (successive ``asyncio.run`` calls) gets a fresh one. Release it with
    ``await model.aclose()`` or ``async with model:``.

    Extended thinking (``thinking={"type": "enabled", "budget_tokens": ...}``, or
    ``{"type": "adaptive"}`` on the models that take it) works across tool turns: the thinking
    blocks of a reply, with their signatures, travel in its
    ``AssistantMessage.provider_data["anthropic"]`` and go back unchanged, in their places.

    Failures are raised as ``ModelCallError``: transient for 408/409/429 (with the server's
    ``Retry-After``), 5xx and 529 ``overloaded_error``, an ``error`` event inside a stream
    (unless its type says the request itself is wrong), timeouts, dropped connections,
    malformed replies and streams cut before ``message_stop``; permanent for the other 4xx
    (bad request, authentication, billing, permission, not found, too large) and a missing
    key. The API key never appears in an error, a repr or a log line.

    Args:
        model: the model name, e.g. ``"claude-sonnet-4-6"``.
        base_url: the API root, e.g. ``"https://api.anthropic.com"``; default: the SDK's.
        api_key: the key; default: the SDK's (``ANTHROPIC_API_KEY``).
        client: a ready ``anthropic.AsyncAnthropic`` to use instead (then ``base_url`` and
            ``api_key`` must be None). It is used through a copy with ``max_retries=0`` and
            is never closed by this adapter: its owner closes it.
        stream: stream replies, reporting fragments to ``ModelRequest.on_delta``. The result
            is the same ModelResponse either way.
        temperature: sampling temperature, for SDKs before 2.0 (API version 2023-06-01). The
            SDK 2.x speaks API version 2026-10-21, which refuses sampling parameters, and
            its ``create`` has none: then this is a ConfigError (a compatible server that
            takes it can get ``extra_body={"temperature": ...}``).
        max_tokens: cap on the reply's tokens, thinking included; the API requires one, and
            None sends ``DEFAULT_MAX_TOKENS``.
        timeout: seconds allowed for one request; None keeps the SDK's default.
        context_window: the model's context window in tokens, for ``Agent`` to keep every
            prompt inside; None when unknown.
        **settings: any other ``messages.create`` argument (``thinking``, ``tool_choice``,
            ``stop_sequences``, ``metadata``, ``extra_headers``, ``extra_body``, ...), sent with
            every request.

    Raises:
        ConfigError: for an empty model name, ``client`` combined with ``base_url`` or
            ``api_key``, a non-positive timeout, ``max_tokens`` or ``context_window``, or a
            setting ``create`` does not accept.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: anthropic.AsyncAnthropic | None = None,
        stream: bool = False,
        temperature: float | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        context_window: int | None = None,
        **settings: Any,
    ) -> None:
        check_adapter_options(
            "AnthropicModel",
            "claude-sonnet-4-6",
            model,
            client=client,
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            context_window=context_window,
        )
        if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
            raise ConfigError(f"max_tokens must be a positive int, got {max_tokens!r}")
        if temperature is not None:
            settings["temperature"] = temperature
        if timeout is not None:
            settings["timeout"] = timeout
        _check_settings(settings)
        self.context_window = context_window
        """The model's context window in tokens, which ``Agent`` takes when its ``Limits``
        name none."""
        self._model = model
        self._base_url = base_url
        self._api_key = api_key
        self._stream = stream
        self._max_tokens = max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS
        self._settings: Mapping[str, Any] = MappingProxyType(dict(settings))
        self._given_client = client.with_options(max_retries=0) if client is not None else None
        self._own_client: anthropic.AsyncAnthropic | None = None
        self._own_loop: asyncio.AbstractEventLoop | None = None
        self._tools_cache: tuple[tuple[ToolSpec, ...], list[dict[str, Any]]] | None = None

    @property
    def name(self) -> str:
        """The model name, as sent to the server."""
        return self._model

    def __repr__(self) -> str:
        parts = [repr(self._model)]
        if self._base_url is not None:
            parts.append(f"base_url={redact_url(self._base_url)!r}")
        parts.append(f"stream={self._stream}")
        parts.append(f"max_tokens={self._max_tokens}")
        if self._settings:
            parts.append(f"settings={sorted(self._settings)}")  # names only: values may be secret
        return f"AnthropicModel({', '.join(parts)})"

    def tool_schema_issues(self, tools: Sequence[ToolSpec]) -> list[ToolSchemaIssue]:
        """What each tool's schema loses on its way to the API (see
        ``anthropic_convert.anthropic_schema``): a top-level ``anyOf``/``oneOf``/``allOf``
        merged into the object (a warning), or a top-level type other than object (fatal).
        Anything else goes as it is: outside strict mode, which this adapter never uses, the
        API takes JSON Schema broadly, ``$ref`` and ``$defs`` included."""
        issues: list[ToolSchemaIssue] = []
        for spec in tools:
            for problem in anthropic_schema(spec.parameters).problems:
                issues.append(
                    ToolSchemaIssue(
                        tool=spec.name,
                        keyword=problem.keyword,
                        provider=PROVIDER,
                        detail=problem.detail,
                        fatal=problem.fatal,
                    )
                )
        return issues

    async def request(self, request: ModelRequest) -> ModelResponse:
        """Send one request, continuing a paused turn (``MAX_CONTINUATIONS`` at most), and
        convert the reply.

        Raises:
            ModelCallError: for every failure of the server, the network or the reply. It is
                raised with no chained cause, because the SDK's exceptions can carry text
                that contains the key.
        """
        failure: ModelCallError | None
        try:
            client = self._client()
        except (anthropic.AnthropicError, ValueError, TypeError) as err:
            message = f"cannot build the Anthropic client: {err} ({_KEY_HINT})"
            failure = ModelCallError(self._scrub(message), transient=False)
        else:
            failure = _credentials_missing(client)
        if failure is not None:
            raise failure  # outside the except blocks, so no __context__ links to the SDK error
        kwargs = self._request_kwargs(request)
        reply = AnthropicReply(fallback_id_prefix=f"{request.run_id}_{request.turn}")
        report = DeltaReporter(request.on_delta, request.run_id)
        timeout = self._settings.get("timeout")
        attempt = Attempt(
            redact_url(f"{str(client.base_url).rstrip('/')}/v1/messages"),
            timeout if timeout is not None else client.timeout,
        )
        for continued in range(MAX_CONTINUATIONS + 1):
            if self._stream:
                failure = await self._streamed_part(client, kwargs, reply, report, attempt)
            else:
                failure = await self._whole_part(client, kwargs, reply, attempt)
            if failure is not None:
                raise failure
            if not reply.paused or continued == MAX_CONTINUATIONS:
                break
            kwargs = {**kwargs, "messages": _continued(kwargs["messages"], reply.continuation())}
        return reply.build()

    async def aclose(self) -> None:
        """Close the client this adapter built, if any; a given ``client`` is left open.

        The adapter stays usable: the next request builds a new client.
        """
        client, self._own_client, self._own_loop = self._own_client, None, None
        if client is not None:
            await client.close()

    # -- internals

    def _client(self) -> anthropic.AsyncAnthropic:
        if self._given_client is not None:
            return self._given_client
        loop = asyncio.get_running_loop()
        if self._own_client is None or self._own_loop is not loop:
            self._own_client = anthropic.AsyncAnthropic(
                api_key=self._api_key, base_url=self._base_url, max_retries=0
            )
            self._own_loop = loop
        return self._own_client

    def _request_kwargs(self, request: ModelRequest) -> dict[str, Any]:
        prompt = to_anthropic_prompt(request.messages)
        kwargs: dict[str, Any] = dict(self._settings)
        kwargs["model"] = self._model
        kwargs["max_tokens"] = self._max_tokens
        if prompt.system is not None:
            kwargs["system"] = prompt.system
        kwargs["messages"] = prompt.messages
        if request.tools:
            kwargs["tools"] = self._wire_tools(request.tools)
            if request.tool_choice is not None:  # the request's own choice wins over settings
                kwargs["tool_choice"] = to_anthropic_tool_choice(request.tool_choice)
        else:
            for key in _TOOL_SETTINGS:
                kwargs.pop(key, None)
            if prompt.tool_names:  # the API refuses tool blocks in a request without tools
                kwargs["tools"] = stub_tools(prompt.tool_names)
                kwargs["tool_choice"] = {"type": "none"}
        if self._stream:
            kwargs["stream"] = True
        return kwargs

    def _wire_tools(self, tools: tuple[ToolSpec, ...]) -> list[dict[str, Any]]:
        # The engine sends the same tuple every turn: convert (and sanitise) it once.
        cached = self._tools_cache
        if cached is not None and cached[0] is tools:
            return cached[1]
        payload = to_anthropic_tools(tools)
        self._tools_cache = (tools, payload)
        return payload

    async def _whole_part(
        self,
        client: anthropic.AsyncAnthropic,
        kwargs: dict[str, Any],
        reply: AnthropicReply,
        attempt: Attempt,
    ) -> ModelCallError | None:
        try:
            message = await client.messages.create(**kwargs)
        except (anthropic.AnthropicError, ValueError, TypeError) as err:
            return self._failure(err, attempt)  # ValueError: a body that is no JSON
        reply.add_message(message)
        return None

    async def _streamed_part(
        self,
        client: anthropic.AsyncAnthropic,
        kwargs: dict[str, Any],
        reply: AnthropicReply,
        report: DeltaReporter,
        attempt: Attempt,
    ) -> ModelCallError | None:
        try:
            stream = await client.messages.create(**kwargs)
        except (anthropic.AnthropicError, ValueError, TypeError) as err:
            return self._failure(err, attempt)
        failure: ModelCallError | None = None
        async with stream:  # releases the connection however the loop below ends
            events = stream.__aiter__()
            while True:
                try:
                    event = await events.__anext__()
                except StopAsyncIteration:
                    break
                except Exception as err:  # the SDK's iterator: error events, transport, decoding
                    failure = self._failure(err, attempt, streaming=True)
                    break
                for delta in reply.add_event(event):
                    report(delta)
        if failure is None:
            reply.end_stream()
        return failure

    def _failure(
        self, err: Exception, attempt: Attempt, *, streaming: bool = False
    ) -> ModelCallError:
        """Map an exception from the SDK to a ModelCallError (scrubbed, never chained) that
        says what failed, where, and after how long."""
        transient = True
        retry_after: float | None = None
        if isinstance(err, anthropic.APITimeoutError):
            message = (
                f"the request to {attempt.url} timed out: no reply within the"
                f" {attempt.timeout()} timeout (gave up after {attempt.elapsed()})"
            )
        elif isinstance(err, anthropic.APIConnectionError):
            message = transport_failure(err.__cause__, attempt, fallback=str(err))
        elif isinstance(err, anthropic.APIStatusError):
            status, kind = err.status_code, _error_type(err.body)
            if status >= 400:
                transient = status in _TRANSIENT_STATUSES or status >= 500
                retry_after = parse_retry_after(err.response.headers) if transient else None
                label = f"HTTP {status}"
            else:  # an ``error`` event inside a stream that began with 200
                transient = kind not in _PERMANENT_TYPES
                label = "error event in the stream"
            label += f", {kind}" if kind else ""
            message = f"{type(err).__name__} ({label}) from {attempt.url}: {_server_message(err)}"
            request_id = getattr(err, "request_id", None)
            if request_id:
                message += f" [request id {request_id}]"
        elif isinstance(err, anthropic.APIError):  # a reply the SDK could not read
            message = f"malformed reply from {attempt.url}: {_server_message(err)}"
        elif isinstance(err, anthropic.AnthropicError | TypeError):
            message, transient = f"Anthropic client error: {err}", False
        elif isinstance(err, ValueError):
            message = f"malformed reply from {attempt.url}: {type(err).__name__}"
        else:  # the HTTP library's own error, from a stream the SDK did not wrap
            message = transport_failure(err, attempt)
        if streaming and isinstance(err, ValueError | anthropic.APIError):
            message = f"while streaming: {message}"
        return ModelCallError(self._scrub(message), transient=transient, retry_after_s=retry_after)

    def _scrub(self, text: str) -> str:
        secrets: set[object] = {self._api_key}
        for client in (self._given_client, self._own_client):
            if client is not None:
                secrets.add(getattr(client, "api_key", None))
                secrets.add(getattr(client, "auth_token", None))
        return scrub_secrets(text, secrets)


def _credentials_missing(client: anthropic.AsyncAnthropic) -> ModelCallError | None:
    """A permanent failure when the client has no way to authenticate (the SDK would raise a
    bare TypeError from inside the request)."""
    if any(
        getattr(client, name, None) is not None for name in ("api_key", "auth_token", "credentials")
    ):
        return None
    return ModelCallError(f"no Anthropic API key: {_KEY_HINT}", transient=False)


def _continued(
    messages: list[dict[str, Any]], content: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``messages`` followed by the paused turn's content as the last assistant message (the
    API continues the turn from it)."""
    if messages and messages[-1]["role"] == "assistant":  # a prefilled reply: one message
        last = messages[-1]
        return [*messages[:-1], {"role": "assistant", "content": [*last["content"], *content]}]
    return [*messages, {"role": "assistant", "content": content}]


def _check_settings(settings: Mapping[str, Any]) -> None:
    reserved = sorted(_RESERVED.intersection(settings))
    if reserved:
        raise ConfigError(f"AnthropicModel sets {reserved} itself; they cannot be settings")
    accepted = _create_parameters()
    if accepted is None:
        return
    problems = [_unknown_setting(key, accepted) for key in sorted(set(settings) - accepted)]
    if problems:
        raise ConfigError("; ".join(problems))


def _unknown_setting(key: str, accepted: frozenset[str]) -> str:
    """Why ``key`` is no setting, and what the user most likely meant."""
    if key == "max_retries":
        return (
            "max_retries: retries are the engine's, where budgets and the termination bound "
            "see them (the SDK client is always used with max_retries=0); set them in Limits"
        )
    if key in _SAMPLING:
        return (
            f"{key}: the installed anthropic SDK ({anthropic.__version__}) has no sampling "
            "parameters, since the API version it speaks (2026-10-21) refuses them; a "
            f"compatible server that takes one can get extra_body={{{key!r}: ...}}"
        )
    if key in _client_parameters():
        return (
            f"{key} is an option of the SDK client, not of a request: pass "
            f"client=anthropic.AsyncAnthropic(..., {key}=...)"
        )
    close = difflib.get_close_matches(key, sorted(accepted), n=1, cutoff=0.85)
    hint = f": did you mean {close[0]!r}?" if close else ""
    return (
        f"messages.create takes no argument {key!r}{hint} "
        "(a field only your server knows goes in extra_body={...})"
    )


@functools.cache
def _client_parameters() -> frozenset[str]:
    """Names ``anthropic.AsyncAnthropic`` accepts (empty if they cannot be read)."""
    try:
        return frozenset(inspect.signature(anthropic.AsyncAnthropic.__init__).parameters) - {"self"}
    except (TypeError, ValueError):  # pragma: no cover - unusual SDK builds
        return frozenset()


def _error_type(body: object) -> str | None:
    """``error.type`` of the API's error body (``{"type": "error", "error": {...}}``)."""
    error = body.get("error") if isinstance(body, Mapping) else None
    kind = error.get("type") if isinstance(error, Mapping) else None
    return kind if isinstance(kind, str) and kind else None


def _server_message(err: anthropic.APIError) -> str:
    body = err.body
    error = body.get("error") if isinstance(body, Mapping) else None
    text = error.get("message") if isinstance(error, Mapping) else None
    if not isinstance(text, str) or not text:
        text = err.message
    return one_line(text)
