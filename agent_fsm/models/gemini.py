"""The Google Gemini adapter: the only module in agent_fsm that imports ``google.genai``.

It speaks the Gemini Developer API (an API key; ``base_url`` for a proxy or a test server)
through the ``google-genai`` SDK. The wire conversion lives in ``gemini_convert`` and the tool
schema rewriting in ``gemini_schema``; the client's life, streaming and scrubbing are
``SDKModel``'s (``models.adapter``). This module builds the client, writes the request and
says what the SDK's failures mean.

Retrying is the engine's job, so every request carries ``HttpRetryOptions(attempts=1)``, on a
client built here and on a given one alike: retries hidden in here would be invisible to the
budgets.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types
from pydantic import ValidationError

from agent_fsm.errors import ConfigError
from agent_fsm.messages import ModelRequest, ToolSpec
from agent_fsm.models.adapter import ReplyReader, SDKModel
from agent_fsm.models.base import ModelCallError, ToolSchemaIssue
from agent_fsm.models.common import (
    Attempt,
    close_field,
    is_transient_status,
    one_line,
    parse_retry_after,
    redact_url,
)
from agent_fsm.models.gemini_convert import (
    GEMINI_PARTS,
    ReplyAssembler,
    needs_signatures,
    output_config,
    output_instruction,
    takes_schema_with_tools,
    to_gemini_contents,
    to_gemini_tools,
)
from agent_fsm.models.gemini_schema import gemini_schema

__all__ = ["GeminiModel"]

PROVIDER = "gemini"
# Config fields the adapter sets itself; a setting may not override them.
_RESERVED = frozenset({"system_instruction", "tools", "http_options", "automatic_function_calling"})
_TOOL_SETTINGS = ("tool_config",)  # only meaningful when tools are sent
_NO_RETRIES: dict[str, Any] = {"attempts": 1}


@functools.cache
def _config_fields() -> frozenset[str]:
    """Names ``GenerateContentConfig`` accepts: the settings a request can carry."""
    return frozenset(genai_types.GenerateContentConfig.model_fields)


class GeminiModel(SDKModel[genai.Client, list[dict[str, Any]]]):
    """A Model backed by Gemini's ``generateContent`` (``streamGenerateContent`` with
    ``stream=True``) on the Gemini Developer API.

    The SDK client is built on first use from ``api_key`` and ``base_url`` (None: the SDK
    reads ``GEMINI_API_KEY``/``GOOGLE_API_KEY``), always for the Developer API, never Vertex.
    (See ``SDKModel`` for its life per event loop and ``aclose``.)

    Gemini 2.5+ thinking models attach a ``thoughtSignature`` to function calls, which must go
    back with the call on later turns (Gemini 3 refuses the history otherwise). They travel in
    the reply's ``provider_data["gemini"]``, so checkpoints and resumes keep them; a call
    without one (another provider's reply, a scripted one) is sent with Google's documented
    stand-in, which skips the check, except to Gemini 1.x/2.x, which never check.

    Typed output (``supports_native_output``): a request's ``output`` goes as
    ``response_mime_type="application/json"`` and its JSON Schema, unchanged, as
    ``response_json_schema`` (over any ``response_schema`` setting). Gemini 3 takes that beside
    function declarations; Gemini 1.x and 2.x refuse the pair (HTTP 400), so on their requests
    that offer tools the schema goes in the system instruction instead, and the engine's
    validation of the reply is all that holds the model to it; on their requests without tools
    it goes in the config. Names are read as for signatures: any but ``gemini-1``/``gemini-2``
    counts as Gemini 3 or later.

    Failures are raised as ``ModelCallError``: transient for 408/409/429 (with the server's
    ``Retry-After`` or ``google.rpc.RetryInfo`` delay) and 5xx, timeouts, dropped connections,
    malformed replies, cut streams and the finish reasons that leave no usable reply;
    permanent for the other 4xx (bad request, permission, not found). The API key never
    appears in an error, a repr or a log line.

    Args:
        model: the model name, e.g. ``"gemini-2.5-flash"``.
        base_url: the API root, e.g. ``"https://generativelanguage.googleapis.com"``.
        api_key: the key; default: the SDK's environment variables.
        client: a ready ``google.genai.Client`` to use instead (then ``base_url`` and
            ``api_key`` must be None); every request turns its retries off, and it is never
            closed by this adapter.
        stream: stream replies, reporting fragments to ``ModelRequest.on_delta``. The result
            is the same ModelResponse either way.
        temperature: sampling temperature; None leaves it to the server.
        max_tokens: cap on the reply's tokens (``max_output_tokens``, thinking included).
        timeout: seconds allowed for one request; None keeps the SDK's default.
        context_window: the model's context window in tokens, for ``Agent`` to keep every
            prompt inside; None when unknown.
        **settings: any other ``GenerateContentConfig`` field (``top_p``, ``thinking_config``,
            ``safety_settings``, ``tool_config``, ...), sent with every request.

    Raises:
        ConfigError: for an empty model name, ``client`` combined with ``base_url`` or
            ``api_key``, a non-positive timeout, or a setting the config does not accept.
    """

    label = "Gemini"
    example = "gemini-2.5-flash"
    key_variables = ("GEMINI_API_KEY", "GOOGLE_API_KEY")

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: genai.Client | None = None,
        stream: bool = False,
        temperature: float | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        context_window: int | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(
            model,
            base_url=base_url,
            api_key=api_key,
            client=client,
            stream=stream,
            timeout=timeout,
            context_window=context_window,
        )
        for key, value in (("temperature", temperature), ("max_output_tokens", max_tokens)):
            if value is not None:
                settings[key] = value
        _check_settings(settings)
        self._timeout_ms = None if timeout is None else max(1, round(timeout * 1000))
        self._settings = MappingProxyType(dict(settings))
        self._check_credentials()

    part_support = GEMINI_PARTS
    """Images and files as inline_data and file_data parts (``GEMINI_PARTS``)."""

    supports_native_output = True
    """Typed output travels as ``response_json_schema`` (in the system instruction instead
    when Gemini 1.x/2.x is offered tools: see the class docstring)."""

    def tool_schema_issues(self, tools: Sequence[ToolSpec]) -> list[ToolSchemaIssue]:
        """What each tool's schema loses on its way to Gemini (see ``gemini_schema``), and
        the tools that cannot be sent at all: a fatal schema, a name Gemini refuses, or a
        converted declaration the installed SDK does not accept."""
        issues: list[ToolSchemaIssue] = []
        for spec in tools:
            converted = gemini_schema(spec.parameters)
            for problem in converted.problems:
                issues.append(
                    ToolSchemaIssue(
                        tool=spec.name,
                        keyword=problem.keyword,
                        provider=PROVIDER,
                        detail=problem.detail,
                        fatal=problem.fatal,
                    )
                )
            if converted.fatal:
                continue
            refused = _sdk_refusal(spec, converted.parameters)
            if refused is not None:
                issues.append(ToolSchemaIssue(spec.name, refused[0], PROVIDER, refused[1], True))
        return issues

    # -- the client

    def _new_client(self) -> genai.Client:
        options = genai_types.HttpOptions(
            base_url=self._base_url,
            retry_options=genai_types.HttpRetryOptions(**_NO_RETRIES),
        )
        return genai.Client(vertexai=False, api_key=self._api_key, http_options=options)

    def _without_retries(self, client: genai.Client) -> genai.Client:
        return client  # every request turns the retries off itself (``_config``)

    async def _close_client(self, client: genai.Client) -> None:
        await client.aio.aclose()
        client.close()

    def _client_secrets(self, client: genai.Client) -> Iterable[object]:
        return (getattr(getattr(client, "_api_client", None), "api_key", None),)

    def _attempt(self, client: genai.Client) -> Attempt:
        options = getattr(getattr(client, "_api_client", None), "_http_options", None)
        base = getattr(options, "base_url", None) or self._base_url or "the Gemini API"
        url = f"{redact_url(str(base)).rstrip('/')} ({self._model})"
        return Attempt(url, self._timeout_ms / 1000 if self._timeout_ms else None)

    # -- the wire conversion

    def _call(self, request: ModelRequest) -> dict[str, Any]:
        config = self._config(request)
        contents = to_gemini_contents(
            request.messages,
            run_id=request.run_id,
            stand_in_signature=needs_signatures(self._model),
            support=GEMINI_PARTS,
        )
        instruction = self._typed(config, request, contents.system_instruction)
        if instruction is not None:
            config["system_instruction"] = instruction
        return {"model": self._model, "contents": contents.contents, "config": config}

    def _reader(self, request: ModelRequest) -> ReplyReader:
        return ReplyAssembler(fallback_id_prefix=f"{request.run_id}_{request.turn}")

    def _send(self, client: genai.Client, call: dict[str, Any]) -> Awaitable[Any]:
        if self._stream:
            return client.aio.models.generate_content_stream(**call)
        return client.aio.models.generate_content(**call)

    def _convert_tools(self, tools: tuple[ToolSpec, ...]) -> list[dict[str, Any]]:
        return to_gemini_tools(tools)

    def _classify(self, err: Exception, attempt: Attempt) -> ModelCallError:
        message, transient, retry_after = _failure_message(err, attempt)
        return ModelCallError(message, transient=transient, retry_after_s=retry_after)

    def _config(self, request: ModelRequest) -> dict[str, Any]:
        config: dict[str, Any] = dict(self._settings)
        http_options: dict[str, Any] = {"retry_options": _NO_RETRIES}
        if self._timeout_ms is not None:
            http_options["timeout"] = self._timeout_ms
        config["http_options"] = http_options
        config["automatic_function_calling"] = {"disable": True}
        tools = self._wire_tools(request.tools) if request.tools else []
        if tools:
            config["tools"] = tools
            if request.tool_choice is not None:  # a hook's choice wins over the settings
                config["tool_config"] = _tool_config(request.tool_choice)
        else:
            for key in _TOOL_SETTINGS:
                config.pop(key, None)
        return config

    def _typed(
        self, config: dict[str, Any], request: ModelRequest, instruction: str | None
    ) -> str | None:
        """Hold the reply to ``request.output`` in ``config``, or, for a model that refuses a
        response schema beside the tools offered, in the system instruction; that
        instruction."""
        output = request.output
        if output is None:
            return instruction
        if "tools" in config and not takes_schema_with_tools(self._model):
            return "\n\n".join(text for text in (instruction, output_instruction(output)) if text)
        config.pop("response_schema", None)  # the API takes one schema or the other
        config.update(output_config(output))
        return instruction


def _check_settings(settings: Mapping[str, Any]) -> None:
    """Refuse a setting the adapter sets itself, one ``GenerateContentConfig`` does not
    take (naming the likely typo), or a value the SDK's own config model refuses."""
    reserved = sorted(_RESERVED.intersection(settings))
    if reserved:
        raise ConfigError(f"GeminiModel sets {reserved} itself; they cannot be settings")
    problems = []
    for key in sorted(set(settings) - _config_fields()):
        if key in ("max_retries", "retry_options"):
            problems.append(
                f"{key}: retries are the engine's, where budgets and the termination bound see "
                "them (the SDK never retries for this adapter); set them in Limits"
            )
            continue
        close = close_field(key, _config_fields())
        hint = f": did you mean {close!r}?" if close else ""
        problems.append(f"GenerateContentConfig takes no field {key!r}{hint}")
    if problems:
        raise ConfigError("; ".join(problems))
    try:
        genai_types.GenerateContentConfig.model_validate(dict(settings))
    except ValidationError as err:
        found = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors())
        raise ConfigError(
            f"GeminiModel settings refused by GenerateContentConfig: {found}"
        ) from None


# Gemini's rule for function names (the API refuses others with HTTP 400).
_FUNCTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}")


def _sdk_refusal(spec: ToolSpec, parameters: dict[str, Any] | None) -> tuple[str, str] | None:
    """(keyword, why) when Gemini refuses the tool's name, or the installed SDK its converted
    declaration."""
    if not _FUNCTION_NAME.fullmatch(spec.name):
        return "name", "Gemini takes function names of letters, digits, _ . : - (up to 128)"
    declaration: dict[str, Any] = {"name": spec.name, "description": spec.description}
    if parameters is not None:
        declaration["parameters"] = parameters
    try:
        genai_types.FunctionDeclaration.model_validate(declaration)
    except ValidationError as err:
        first = err.errors()[0]
        where = "/".join(str(p) for p in first["loc"]) or "parameters"
        return where, f"the installed google-genai SDK refuses the converted schema: {first['msg']}"
    return None


# --------------------------------------------------------------------------- failures

_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"


def _failure_message(err: Exception, attempt: Attempt) -> tuple[str, bool, float | None]:
    """(message, transient, retry-after seconds) for an exception from the SDK's call."""
    if isinstance(err, genai_errors.APIError):
        return _status_failure(err, attempt)
    if isinstance(err, ValueError):  # a body that is no JSON, or no GenerateContentResponse
        return f"malformed reply from {attempt.url}: {type(err).__name__}: {err}", True, None
    kind = type(err).__name__
    library = type(err).__module__.split(".")[0]
    if library in ("httpx", "httpx2", "aiohttp") or isinstance(err, OSError | TimeoutError):
        if "Timeout" in kind or isinstance(err, TimeoutError):
            return (
                f"the request to {attempt.url} timed out ({attempt.timeout()} timeout; gave up"
                f" after {attempt.elapsed()})",
                True,
                None,
            )
        if "Connect" in kind or isinstance(err, ConnectionRefusedError):
            return f"cannot connect to {attempt.url}: {kind}: {err}", True, None
        return (
            f"{attempt.url} closed the connection after {attempt.elapsed()} without a complete"
            f" reply: {kind}: {err}",
            True,
            None,
        )
    return f"unexpected error from the Gemini client: {kind}: {err}", False, None


def _status_failure(err: genai_errors.APIError, attempt: Attempt) -> tuple[str, bool, float | None]:
    status = err.code if isinstance(err.code, int) else 0
    transient = is_transient_status(status) or status == 0
    label = f"HTTP {status}" + (f", {err.status}" if err.status else "")
    text = err.message if isinstance(err.message, str) and err.message else str(err)
    text = one_line(text)
    message = f"{type(err).__name__} ({label}) from {attempt.url}: {text}"
    return message, transient, _retry_after(err) if transient else None


def _retry_after(err: genai_errors.APIError) -> float | None:
    """The delay the server asked for: a ``Retry-After`` header, else the ``retryDelay`` of
    a ``google.rpc.RetryInfo`` in the error's details (Gemini's usual way)."""
    headers = getattr(err.response, "headers", None)
    if isinstance(headers, Mapping):
        lowered = {str(k).lower(): str(v) for k, v in headers.items()}
        delay = parse_retry_after(lowered)
        if delay is not None:
            return delay
    body = err.details if isinstance(err.details, Mapping) else {}
    error = body.get("error", body)
    details = error.get("details") if isinstance(error, Mapping) else None
    for detail in details if isinstance(details, list) else ():
        if isinstance(detail, Mapping) and detail.get("@type") == _RETRY_INFO:
            return _duration(detail.get("retryDelay"))
    return None


def _duration(raw: object) -> float | None:
    """Seconds of a protobuf JSON duration (``"7s"``, ``"0.5s"``); None if unreadable."""
    if not isinstance(raw, str) or not raw.endswith("s"):
        return None
    try:
        seconds = float(raw[:-1])
    except ValueError:
        return None
    return seconds if seconds >= 0 and seconds != float("inf") else None


def _tool_config(choice: str) -> dict[str, Any]:
    """``ModelRequest.tool_choice`` as Gemini's ``function_calling_config``: ``auto`` is AUTO,
    ``required`` is ANY, ``none`` is NONE, and a tool's name is ANY restricted to it."""
    modes = {"auto": "AUTO", "required": "ANY", "none": "NONE"}
    if choice in modes:
        return {"function_calling_config": {"mode": modes[choice]}}
    return {"function_calling_config": {"mode": "ANY", "allowed_function_names": [choice]}}
