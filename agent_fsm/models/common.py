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

from agent_fsm.logs import get_logger
from agent_fsm.messages import ReplyDelta

__all__ = ["MIN_SECRET_CHARS", "DeltaReporter", "parse_retry_after", "scrub_secrets"]

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
