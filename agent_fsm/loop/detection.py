"""Loop detection, O(1) amortised per turn.

Four patterns, each kept incrementally in ``LoopState`` so no turn rescans the history. All
of them count turns, never calls within one reply: the calls of one reply are a fan-out made
at one moment, not a sequence in time, so three parallel lookups (even of the same thing) are
no loop.

* the same tool call (name and canonicalised arguments) in ``k`` tool turns in a row;
* the same results for a whole tool turn ``k`` turns in a row;
* the same non-empty assistant text, with the same tool calls, ``k`` times in a row;
* a cycle of tool turns with period ``2 ≤ q ≤ p`` (A,B,A,B,…) repeated ``k`` times, a turn
  being the set of its calls: for each q we count how many consecutive turns equal the turn q
  turns earlier; ``q·(k-1)`` such matches in a row mean the last ``q·k`` turns are ``k``
  copies of one cycle.

A signature is the tool name and a stable fingerprint of the canonical arguments: the text
itself when it is short (exact, and cheaper than hashing), otherwise a BLAKE2 digest, so
``LoopState`` stays small whatever the arguments. Never ``hash()``, which changes between
processes: a checkpoint resumed elsewhere must compare equal.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from pydantic_core import to_json

from agent_fsm.limits import Limits
from agent_fsm.messages import ToolMessage
from agent_fsm.state import LoopState

__all__ = [
    "VERBATIM_CHARS",
    "canonical_arguments",
    "fingerprint",
    "record_calls",
    "record_reply_text",
    "record_turn_results",
]


VERBATIM_CHARS = 64
"""Texts up to this long are their own fingerprint; longer ones are digested."""


def fingerprint(text: str) -> str:
    """A short stable stand-in for ``text``: equal exactly when the texts are equal (up to a
    64-bit digest collision for texts longer than ``VERBATIM_CHARS``)."""
    if len(text) <= VERBATIM_CHARS:
        return "=" + text
    return "#" + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


_NESTED = (dict, list)


def _keys_sorted(value: Any) -> Any:
    """A parsed JSON value with every object's keys in sorted order (scalars are taken as
    they are, without a call each: most arguments are flat objects)."""
    if type(value) is dict:
        return {
            key: _keys_sorted(item) if type(item) in _NESTED else item
            for key, item in sorted(value.items())
        }
    if type(value) is list:
        return [_keys_sorted(item) if type(item) in _NESTED else item for item in value]
    return value


def canonical_arguments(parsed: Any, raw: str) -> str:
    """Arguments in a canonical text form: compact JSON with sorted keys (NaN and Infinity
    spelled out, so they differ from null); the raw text, stripped, if it did not parse.

    pydantic_core's serialiser, because this runs for every call and it costs about half of
    a sorting ``json.JSONEncoder``.
    """
    if parsed is None:
        return raw.strip()
    return to_json(_keys_sorted(parsed), inf_nan_mode="constants").decode()


_NAMED_CALLS = 3
"""A turn signature names up to this many of its tools (for the loop message)."""


def record_calls(loop: LoopState, calls: Sequence[tuple[str, str]], limits: Limits) -> None:
    """Feed one tool turn's calls (one reply's), as (tool name, canonical arguments); their
    order and repeats within the reply do not matter."""
    if not limits.loop_detection or not calls:
        return
    k = limits.loop_threshold
    distinct = {f"{name}:{fingerprint(arguments)}": (name, arguments) for name, arguments in calls}
    streaks = loop.call_streaks
    loop.call_streaks = streaks = {sig: streaks.get(sig, 0) + 1 for sig in distinct}
    if loop.detected is None:
        repeating = [distinct[sig] for sig, turns in streaks.items() if turns >= k]
        if repeating:
            named = ", ".join(f"{name}({arguments})" for name, arguments in repeating)
            loop.detected = f"the same call {named} in {k} turns in a row"
    _record_turn_signature(loop, _turn_signature(distinct), limits)


def _turn_signature(distinct: dict[str, tuple[str, str]]) -> str:
    """``name:fingerprint`` of the turn's set of calls: the call's own signature for a turn of
    one call; otherwise its tools' names and a fingerprint of the sorted call signatures."""
    if len(distinct) == 1:
        return next(iter(distinct))
    names = sorted({name for name, _ in distinct.values()})
    label = "+".join(names[:_NAMED_CALLS]) + ("+…" if len(names) > _NAMED_CALLS else "")
    return f"{label}:{fingerprint(chr(0x1E).join(sorted(distinct)))}"


def _describe(signature: str) -> str:
    """A turn signature for people: the call with its arguments when they are short enough
    to have been kept verbatim, else the tools' names."""
    name, _, print_ = signature.partition(":")
    return f"{name}({print_[1:]})" if print_.startswith("=") else name


def _record_turn_signature(loop: LoopState, signature: str, limits: Limits) -> None:
    k, max_period = limits.loop_threshold, limits.loop_max_period
    matches = loop.period_matches
    if len(matches) != max_period + 1:
        matches = loop.period_matches = [0] * (max_period + 1)
    recent = loop.recent_calls
    recent.append(signature)
    size = len(recent)
    for period in range(2, max_period + 1):
        if size > period and recent[-1 - period] == signature:
            matches[period] += 1
            if matches[period] >= period * (k - 1) and loop.detected is None:
                cycle = " → ".join(_describe(s) for s in recent[-period:])
                loop.detected = f"a cycle of {period} turns ({cycle}) repeated {k} times"
        else:
            matches[period] = 0
    if size > max_period + 1:
        del recent[0]


def record_turn_results(loop: LoopState, results: Sequence[ToolMessage], limits: Limits) -> None:
    """Feed the results of one tool turn, in call order."""
    if not limits.loop_detection or not results:
        return
    if len(results) == 1:
        text = f"{results[0].name}\x1f{results[0].content}"
    else:
        text = "\x1e".join([f"{r.name}\x1f{r.content}" for r in results])
    signature = fingerprint(text)
    if signature == loop.last_results:
        loop.result_repeats += 1
    else:
        loop.last_results, loop.result_repeats = signature, 1
    if loop.result_repeats >= limits.loop_threshold and loop.detected is None:
        loop.detected = f"the same tool results {loop.result_repeats} turns in a row"


def record_reply_text(
    loop: LoopState, text: str, limits: Limits, calls: Sequence[tuple[str, str]] = ()
) -> None:
    """Feed the visible text of one reply with its tool calls (name, arguments); empty text
    breaks a run of repeats. The same short preamble ("Let me search.") before calls that make
    progress is no loop: a repeat is the same text with the same calls."""
    if not limits.loop_detection:
        return
    stripped = text.strip()
    if not stripped:
        loop.last_text, loop.text_repeats = None, 0
        return
    signature = fingerprint(stripped + "".join(f"\x00{name}\x00{args}" for name, args in calls))
    if signature == loop.last_text:
        loop.text_repeats += 1
    else:
        loop.last_text, loop.text_repeats = signature, 1
    if loop.text_repeats >= limits.loop_threshold and loop.detected is None:
        loop.detected = f"the same reply text {loop.text_repeats} times in a row"
