"""Loop detection, O(1) amortised per turn.

Four patterns, each kept incrementally in ``LoopState`` so no turn rescans the history:

* the same tool call (name and canonicalised arguments) ``k`` times in a row;
* the same results for a whole tool turn ``k`` turns in a row (per turn, not per call, so that
  three parallel lookups that happen to agree are not a loop);
* the same non-empty assistant text ``k`` times in a row;
* a cycle of calls with period ``2 ≤ q ≤ p`` (A,B,A,B,…) repeated ``k`` times: for each q we
  count how many consecutive calls equal the call q positions earlier; ``q·(k-1)`` such
  matches in a row mean the last ``q·k`` calls are ``k`` copies of one cycle.

Signatures are short, stable BLAKE2 digests (not ``hash()``, which changes between processes)
prefixed with the tool name, so a checkpoint resumed elsewhere compares equal and a detected
loop can be described by name.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from agent_fsm.limits import Limits
from agent_fsm.messages import ToolMessage
from agent_fsm.state import LoopState

__all__ = ["canonical_arguments", "record_calls", "record_reply_text", "record_turn_results"]


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
"""Built once: ``json.dumps`` with options builds a new encoder on every call."""


def canonical_arguments(parsed: Any, raw: str) -> str:
    """Arguments in a canonical text form: sorted keys, no whitespace; raw text if unparsed."""
    if parsed is None:
        return raw.strip()
    return _CANONICAL.encode(parsed)


def record_calls(loop: LoopState, calls: Sequence[tuple[str, str]], limits: Limits) -> None:
    """Feed one turn's calls, as (tool name, canonical arguments), in order."""
    if not limits.loop_detection:
        return
    k = limits.loop_threshold
    max_period = limits.loop_max_period
    if len(loop.period_matches) != max_period + 1:
        loop.period_matches = [0] * (max_period + 1)
    for name, arguments in calls:
        signature = f"{name}:{_digest(arguments)}"
        if signature == loop.last_call:
            loop.call_repeats += 1
        else:
            loop.last_call, loop.call_repeats = signature, 1
        if loop.call_repeats >= k and loop.detected is None:
            loop.detected = f"the same call {name}({arguments}) {k} times in a row"
        recent = loop.recent_calls
        recent.append(signature)
        for period in range(2, max_period + 1):
            if len(recent) > period and recent[-1 - period] == signature:
                loop.period_matches[period] += 1
                if loop.period_matches[period] >= period * (k - 1) and loop.detected is None:
                    cycle = " → ".join(s.split(":", 1)[0] for s in recent[-period:])
                    loop.detected = f"a cycle of {period} calls ({cycle}) repeated {k} times"
            else:
                loop.period_matches[period] = 0
        if len(recent) > max_period + 1:
            del recent[0]


def record_turn_results(loop: LoopState, results: Sequence[ToolMessage], limits: Limits) -> None:
    """Feed the results of one tool turn, in call order."""
    if not limits.loop_detection or not results:
        return
    signature = _digest("\x1e".join(f"{r.name}\x1f{r.content}" for r in results))
    if signature == loop.last_results:
        loop.result_repeats += 1
    else:
        loop.last_results, loop.result_repeats = signature, 1
    if loop.result_repeats >= limits.loop_threshold and loop.detected is None:
        loop.detected = f"the same tool results {loop.result_repeats} turns in a row"


def record_reply_text(loop: LoopState, text: str, limits: Limits) -> None:
    """Feed the visible text of one reply; empty text breaks a run of repeats."""
    if not limits.loop_detection:
        return
    if not text.strip():
        loop.last_text, loop.text_repeats = None, 0
        return
    signature = _digest(text.strip())
    if signature == loop.last_text:
        loop.text_repeats += 1
    else:
        loop.last_text, loop.text_repeats = signature, 1
    if loop.text_repeats >= limits.loop_threshold and loop.detected is None:
        loop.detected = f"the same reply text {loop.text_repeats} times in a row"
