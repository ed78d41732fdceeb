"""The tool hooks, run: ``before_tool`` decides whether and how a call runs, ``after_tool``
may replace its answer. ``agent_fsm.hooks`` says what each may do and why; this module turns
every answer a hook gives, and every way it fails, into the call to run or the call's answer.

Must not raise for anything a hook does: a hook that raises (``BaseException``s included, as
``failures.is_own_failure`` draws the line), returns what it may not, or outlasts its time
limit gives its call an error answer that names the hook. Fail safe: a call whose
``before_tool`` failed is not run, and a call whose ``after_tool`` failed has its output
withheld from the model (the hook may have been there to redact it).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import JsonValue, ValidationError

from agent_fsm.failures import describe, is_own_failure
from agent_fsm.messages import ToolCall, ToolMessage, ToolStatus, clean_message, clean_text
from agent_fsm.tools.results import error_result, merge_runtime_details, truncate
from agent_fsm.tools.tool import PreparedCall, ToolRegistry

__all__ = [
    "AfterTool",
    "BeforeTool",
    "Deny",
    "HookFailed",
    "ToolDecision",
    "call_hook",
    "review_result",
    "screen_call",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Deny:
    """``before_tool``'s refusal: the call is not run, and the model reads ``reason``."""

    reason: str
    """Why, for the model: the call is answered "Tool '<name>' was not run: <reason>"."""


ToolDecision = Deny | dict[str, Any] | None
"""What ``before_tool`` returns: None (go on), ``Deny``, or the new arguments."""

BeforeTool = Callable[[ToolCall, dict[str, Any]], ToolDecision | Awaitable[ToolDecision]]
"""``before_tool(call, arguments)``: the call as the model made it, a copy of its validated
JSON arguments."""

AfterTool = Callable[[ToolCall, ToolMessage], ToolMessage | Awaitable[ToolMessage | None] | None]
"""``after_tool(call, result)``: the call that ran (with the arguments it ran with), and its
answer."""


class HookFailed(Exception):
    """A hook raised or ran out of time; ``str`` says how, ``original`` is what it raised."""

    def __init__(self, message: str, original: BaseException | None = None) -> None:
        super().__init__(message)
        self.original = original


async def call_hook(hook: Callable[..., Any], timeout_s: float | None, *args: Any) -> Any:
    """What ``hook(*args)`` returns, awaited when it is awaitable, within ``timeout_s``
    (None: no limit of its own).

    Raises:
        HookFailed: for anything the hook raised, or its time limit.
        asyncio.CancelledError, KeyboardInterrupt: the run's own, passed on.
    """
    try:
        async with asyncio.timeout(timeout_s):
            try:
                answer = hook(*args)
                if inspect.isawaitable(answer):
                    answer = await answer
            except BaseException as exc:
                if not is_own_failure(exc):
                    raise  # the run's cancellation (or the time limit's), or Ctrl-C
                raise HookFailed(describe(exc), exc) from None
    except TimeoutError:  # only the time limit's: the hook's own became HookFailed inside
        raise HookFailed(f"it did not finish within {timeout_s:g} s") from None
    return answer


def _denied(call: ToolCall, reason: str, limit: int) -> ToolMessage:
    """The answer of a denied call, the reason held to the tool's output limit (``limit``):
    it stands where the tool's output would, and must not take the whole turn's room."""
    if len(reason) > limit:
        reason = (
            f"{reason[:limit]}\n[the reason was cut: {len(reason) - limit:,} of "
            f"{len(reason):,} characters]"
        )
    return error_result(
        call, f"Tool '{call.name}' was not run: {reason}", {"runtime": {"denied": reason}}
    )


def _hook_failed(call: ToolCall, hook: str, problem: str, what: str) -> ToolMessage:
    """The answer of a call whose ``hook`` failed: ``what`` says what that meant for it."""
    failure: dict[str, JsonValue] = {"hook": hook, "error": problem}
    return error_result(
        call,
        f"Tool '{call.name}' {what}: the {hook} hook failed ({problem}).",
        {"runtime": {"hook_failed": failure}},
    )


_NOT_RUN = "was not run"
_WITHHELD = "ran, but its output is withheld"


async def screen_call(
    hook: BeforeTool,
    item: PreparedCall,
    registry: ToolRegistry,
    timeout_s: float,
    limit: int = 20_000,
) -> PreparedCall | ToolMessage:
    """Put a valid call to ``before_tool``: the call to go on with (``item``, or the call
    prepared again with the hook's arguments, the change in its ``runtime``), or the answer
    of a call that is not run (denied, or the hook failed). Must not raise, except the run's
    own cancellation.

    The hook gets a copy of the arguments: a change it makes in place counts only when it
    returns them. A ``Deny`` reason longer than ``limit`` (the tool's output limit) is cut.
    """
    call = item.call
    try:
        answer = await call_hook(hook, timeout_s, call, copy.deepcopy(item.arguments))
    except HookFailed as failure:
        return _hook_failed(call, "before_tool", str(failure), _NOT_RUN)
    if answer is None:
        return item
    if isinstance(answer, Deny):
        if not isinstance(answer.reason, str):
            problem = f"its Deny reason is a {type(answer.reason).__name__}, not a str"
            return _hook_failed(call, "before_tool", problem, _NOT_RUN)
        return _denied(call, clean_text(answer.reason), limit)
    if not isinstance(answer, dict):
        problem = f"it returned {type(answer).__name__}, not None, Deny or a dict of arguments"
        return _hook_failed(call, "before_tool", problem, _NOT_RUN)
    if answer == item.arguments:
        return item
    return _with_arguments(item, answer, registry)


def _with_arguments(
    item: PreparedCall, arguments: dict[str, Any], registry: ToolRegistry
) -> PreparedCall | ToolMessage:
    """``item``'s call prepared again with the hook's ``arguments``: validated and converted
    as the model's are, the change recorded; an error answer when they do not pass."""
    call = item.call
    try:
        text = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        problem = f"its arguments are not JSON ({describe(exc)})"
        return _hook_failed(call, "before_tool", problem, _NOT_RUN)
    changed = registry.prepare(call.model_copy(update={"arguments": clean_text(text)}))
    if changed.error is not None:
        problem = f"its arguments were refused: {changed.error}"
        return _hook_failed(call, "before_tool", problem, _NOT_RUN)
    changed.runtime = {"arguments_changed": {"from": item.arguments, "to": changed.arguments}}
    return changed


async def review_result(
    hook: AfterTool, item: PreparedCall, result: ToolMessage, timeout_s: float, limit: int
) -> ToolMessage:
    """The answer of a call that ran, after ``after_tool``: ``result``, or the hook's
    replacement (checked, cleaned, cut to ``limit`` characters, marked ``result_changed``),
    or, when the hook failed, an error that withholds the output. Must not raise, except the
    run's own cancellation."""
    call = item.call
    try:
        answer = await call_hook(hook, timeout_s, call, result)
    except HookFailed as failure:
        return _hook_failed(call, "after_tool", str(failure), _WITHHELD)
    if answer is None or answer is result:
        return result
    replaced = _replacement(result, answer)
    if isinstance(replaced, str):
        return _hook_failed(call, "after_tool", replaced, _WITHHELD)
    runtime: dict[str, JsonValue] = {"result_changed": True}
    content = replaced.content
    if len(content) > limit:
        runtime.update(original_chars=len(content), shown_chars=limit)
        content = truncate(content, limit, call.name)
    details = merge_runtime_details(replaced.details, runtime)
    return replaced.model_copy(update={"content": content, "details": details})


def _replacement(result: ToolMessage, answer: object) -> ToolMessage | str:
    """``answer`` validated as the replacement of ``result``, or why it is none."""
    if not isinstance(answer, ToolMessage):
        return f"it returned {type(answer).__name__}, not a ToolMessage or None"
    if (answer.tool_call_id, answer.name) != (result.tool_call_id, result.name):
        return "its ToolMessage answers another call (the call id and name cannot change)"
    try:  # ``model_copy(update=...)`` does not validate: a copy may hold anything
        checked = ToolMessage.model_validate(
            {
                "tool_call_id": answer.tool_call_id,
                "name": answer.name,
                "content": answer.content,
                "status": answer.status,
                "details": answer.details,
            }
        )
    except ValidationError as exc:
        return f"its ToolMessage is invalid: {exc.errors()[0]['msg']}"
    if checked.status is ToolStatus.SKIPPED:
        return "its ToolMessage says 'skipped', but the call ran: use 'ok' or 'error'"
    return clean_message(checked)
