"""What every provider adapter needs alike, whatever its SDK: the server's requested delay,
a shield around the caller's ``on_delta``, and keeping credentials out of error text.

No SDK is imported here: each adapter stays the only importer of its own.
"""

from __future__ import annotations

import difflib
import email.utils
import math
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC
from types import TracebackType
from typing import Any, Self

from agent_fsm.errors import ConfigError
from agent_fsm.logs import get_logger
from agent_fsm.messages import ReplyDelta
from agent_fsm.models.base import ModelCallError

__all__ = [
    "MAX_MESSAGE_CHARS",
    "MIN_SECRET_CHARS",
    "TRANSIENT_STATUSES",
    "Attempt",
    "ClosesOnExit",
    "DeltaReporter",
    "check_adapter_options",
    "context_overflow",
    "close_field",
    "field_of",
    "is_transient_status",
    "malformed",
    "one_line",
    "optional_str",
    "parse_retry_after",
    "redact_url",
    "resolve_ref",
    "scrub_secrets",
    "transport_failure",
]

MAX_MESSAGE_CHARS = 500
"""The most of a server's error text an error message quotes."""

TRANSIENT_STATUSES = frozenset({408, 409, 429})
"""The 4xx statuses worth retrying, as the SDKs themselves would: timeout, conflict, rate
limit. Every 5xx is too (``is_transient_status``)."""

MIN_SECRET_CHARS = 8
"""Shorter "keys" are placeholders for local servers (``"x"``, ``"none"``), not secrets:
scrubbing them would mangle ordinary words in error messages."""


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """The delay, in seconds, a server asked for before the next attempt.

    Reads ``retry-after-ms`` (milliseconds) first, then ``retry-after`` as seconds or as an
    HTTP date. Returns None when neither is present or readable; never a negative number.

    Args:
        headers: response headers; lookups must be case-insensitive (as httpx's are) or the
            names lower-case.
        now: the current POSIX time, for dates; defaults to ``time.time()``.
    """
    millis = _finite(headers.get("retry-after-ms"))
    if millis is not None:
        return max(millis / 1000.0, 0.0)
    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _finite(raw)
    if seconds is not None:
        return max(seconds, 0.0)
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": a date with no zone; HTTP dates are GMT anyway
        when = when.replace(tzinfo=UTC)
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


def _finite(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def scrub_secrets(text: str, secrets: Iterable[object]) -> str:
    """``text`` with every secret in ``secrets`` (strings of at least ``MIN_SECRET_CHARS``)
    replaced by ``[redacted]``; other values (None, short placeholders) are ignored.

    Adapters run every error message through this before it leaves them, since servers and
    SDKs echo request details (a key in a URL, a header in a debug message) back in errors.
    """
    for secret in secrets:
        if isinstance(secret, str) and len(secret) >= MIN_SECRET_CHARS:
            text = text.replace(secret, "[redacted]")
    return text


class DeltaReporter:
    """Calls ``on_delta``, shielding the request from a callback that raises: a broken
    listener must not fail a model call (it is logged once per request instead)."""

    __slots__ = ("_failures", "_on_delta", "_run_id")

    def __init__(self, on_delta: Callable[[ReplyDelta], None] | None, run_id: str) -> None:
        self._on_delta = on_delta
        self._run_id = run_id
        self._failures = 0

    def __call__(self, delta: ReplyDelta) -> None:
        if self._on_delta is None:
            return
        try:
            self._on_delta(delta)
        except Exception as err:
            self._failures += 1
            if self._failures == 1:  # once per request: a broken listener must not flood logs
                get_logger(__name__).warning(
                    "on_delta_failed", run_id=self._run_id, error=f"{type(err).__name__}: {err}"
                )


def check_adapter_options(
    adapter: str,
    example: str,
    model: object,
    *,
    client: object,
    base_url: str | None,
    api_key: str | None,
    timeout: float | None,
    context_window: int | None,
) -> None:
    """The constructor checks every adapter makes, with the same messages: a model name, a
    ready ``client`` or ``base_url``/``api_key`` (not both), a positive timeout and context
    window.

    Raises:
        ConfigError: naming the adapter (``adapter``) and an example model name.
    """
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(f"{adapter} needs a model name, e.g. {example!r}")
    if client is not None and (base_url is not None or api_key is not None):
        raise ConfigError("pass either client= or base_url=/api_key=, not both")
    if timeout is not None and not timeout > 0:
        raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if context_window is not None and (type(context_window) is not int or context_window < 1):
        raise ConfigError(f"context_window must be a positive int, got {context_window!r}")


class ClosesOnExit:
    """``async with model:`` closes what the adapter opened (its ``aclose``) on the way out."""

    async def aclose(self) -> None:
        """Release what the adapter holds; adapters override it."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def is_transient_status(status: int) -> bool:
    """Whether an HTTP error status may pass on a retry: 408, 409, 429 and every 5xx."""
    return status in TRANSIENT_STATUSES or status >= 500


def close_field(key: str, accepted: Iterable[str]) -> str | None:
    """The field ``key`` is most likely a typo of, for a setting no request takes. The cutoff
    (0.85) catches typos (temprature) but not a different real field (top_k is no top_p)."""
    close = difflib.get_close_matches(key, sorted(accepted), n=1, cutoff=0.85)
    return close[0] if close else None


def one_line(text: str) -> str:
    """A server's error text for a message: on one line, cut to ``MAX_MESSAGE_CHARS``."""
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "..."


def redact_url(url: str) -> str:
    """The URL without user info or query, which can hold credentials (``?key=``)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<invalid url>"
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


class Attempt:
    """One request's where and when, for its error message."""

    __slots__ = ("_began", "_timeout", "url")

    def __init__(self, url: str, timeout: object) -> None:
        self.url = url
        """Where the request went, credentials already taken out (``redact_url``)."""
        self._timeout = timeout
        self._began = time.monotonic()

    def elapsed(self) -> str:
        return f"{time.monotonic() - self._began:.1f} s"

    def timed_out(self) -> str:
        """The message for a request that met its timeout."""
        return (
            f"the request to {self.url} timed out: no reply within the"
            f" {self.timeout()} timeout (gave up after {self.elapsed()})"
        )

    def timeout(self) -> str:
        """The timeout in force: seconds, or an SDK's ``Timeout`` object (its read timeout
        is the one a slow reply meets); None is the SDK's own default."""
        if self._timeout is None:
            return "the SDK's"
        read = getattr(self._timeout, "read", self._timeout)
        return f"{read:g} s" if isinstance(read, int | float) else str(self._timeout)


def transport_failure(cause: BaseException | None, attempt: Attempt, *, fallback: str = "") -> str:
    """Describe an HTTP library's exception ``cause`` by its class name (no adapter imports an
    HTTP library): no connection made, one the server dropped before its reply was
    complete, or another failure to reach it."""
    kind = type(cause).__name__ if cause is not None else ""
    detail = str(cause) if cause is not None and str(cause) else kind or fallback
    if kind in {"ConnectError", "ConnectTimeout"}:
        if _caused_by(cause, ConnectionRefusedError):
            return f"cannot connect to {attempt.url}: connection refused (is the server running?)"
        return f"cannot connect to {attempt.url}: {detail}"
    if kind in {"RemoteProtocolError", "ReadError", "WriteError", "CloseError"}:
        return (
            f"{attempt.url} closed the connection after {attempt.elapsed()} without a"
            f" complete reply: {detail}"
        )
    return f"cannot reach {attempt.url} (failed after {attempt.elapsed()}): {detail}"


def _caused_by(err: BaseException | None, kind: type[BaseException]) -> bool:
    """Whether ``kind`` is in ``err``'s chain of causes and contexts."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, kind):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


_OVERFLOW = re.compile(
    r"context_length_exceeded|exceed_context_size|exceeds the available context size"
    r"|maximum context length|prompt is too long|input token count.{0,40}exceeds"
    r"|exceeds the maximum number of tokens|context window",
    re.IGNORECASE,
)
"""What the servers say when a prompt is longer than the model's context: OpenAI's code
and message, llama.cpp's error type and message, Anthropic's, Gemini's."""

_PROMPT_SIZE = re.compile(
    r"resulted in (\d+) tokens|prompt is too long: (\d+) tokens|input token count \((\d+)\)"
    r"|\"n_prompt_tokens\": ?(\d+)|n_prompt_tokens=(\d+)",
    re.IGNORECASE,
)


def context_overflow(text: str) -> tuple[bool, int | None]:
    """Whether a server's refusal ``text`` says the prompt is longer than the context, and
    the prompt's size by the server's count when it says (see ``ModelCallError``)."""
    if not _OVERFLOW.search(text):
        return False, None
    found = _PROMPT_SIZE.search(text)
    size = next((int(group) for group in found.groups() if group), None) if found else None
    return True, size


# -- reading replies: SDK objects and plain mappings alike


def field_of(obj: object, name: str) -> Any:
    """Read ``name`` from an SDK object or a plain mapping; None when absent.

    Readers of replies take both, since SDK versions differ in what they parse into models
    and what they leave as dicts (an unknown event type, an older SDK's stream)."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def optional_str(value: object, what: str) -> str | None:
    """``value`` when it is a string or None.

    Raises:
        ModelCallError: transient (``malformed``), naming ``what``, for anything else.
    """
    if value is None or isinstance(value, str):
        return value
    raise malformed(f"{what} is not a string")


def malformed(detail: str, *, source: str = "the server") -> ModelCallError:
    """The failure for a reply that cannot be read: transient, since a server that sent
    garbage once (a proxy's error page, a cut body) usually answers properly next time."""
    return ModelCallError(f"malformed reply from {source}: {detail}", transient=True)


def resolve_ref(root: Mapping[str, Any], ref: str) -> Any:
    """The part of the JSON Schema ``root`` a local ``$ref`` ("#", "#/$defs/Name") points to,
    else None (another document, an anchor, or a pointer to nothing: not followed)."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node: Any = root
    for raw in ref[2:].split("/"):
        token = urllib.parse.unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node
