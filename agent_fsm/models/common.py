"""What every provider adapter needs alike, whatever its SDK: the server's requested delay,
a shield around the caller's ``on_delta``, and keeping credentials out of error text.

No SDK is imported here: each adapter stays the only importer of its own.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC
from types import TracebackType
from typing import Self

from agent_fsm.errors import ConfigError
from agent_fsm.logs import get_logger
from agent_fsm.messages import ReplyDelta

__all__ = [
    "MIN_SECRET_CHARS",
    "ClosesOnExit",
    "DeltaReporter",
    "check_adapter_options",
    "parse_retry_after",
    "scrub_secrets",
]

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
