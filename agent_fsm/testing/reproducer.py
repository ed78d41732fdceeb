"""Python source for a failing case: the model's replies in order, ready to paste.

``reproducer(...)`` writes a short script that rebuilds the run with a ``ScriptedModel`` over
the replies the model actually gave (``reply(...)``/``call(...)``), the tool doubles that were
in play, and the same fake clock, then checks the invariants. It expects a name ``agent``
bound to the agent under test, so it runs as is inside the user's test.
"""

from __future__ import annotations

import asyncio
import json
import keyword
from collections.abc import Iterable, Mapping, Sequence

from agent_fsm.messages import FinishReason, ModelResponse, ToolCall, Usage, UserInput
from agent_fsm.models.base import ModelCallError
from agent_fsm.testing.behaviour import EXHAUSTED, ToolOutcome, UnreadableError

__all__ = ["item_source", "reproducer", "script_source"]


def _call_source(tool_call: ToolCall) -> tuple[str, str]:
    """(source, helper name) for one tool call."""
    try:
        arguments = json.loads(tool_call.arguments)
    except ValueError:
        arguments = None
    exact = isinstance(arguments, dict) and json.dumps(arguments) == tool_call.arguments
    if tool_call.id or not exact:
        extra = f", id={tool_call.id!r}" if tool_call.id else ""
        return f"raw_call({tool_call.name!r}, {tool_call.arguments!r}{extra})", "raw_call"
    assert isinstance(arguments, dict)
    if all(k.isidentifier() and not keyword.iskeyword(k) for k in arguments):
        parts = [f"{k}={v!r}" for k, v in arguments.items()]
    else:
        parts = [f"**{arguments!r}"] if arguments else []
    return f"call({', '.join([repr(tool_call.name), *parts])})", "call"


def _usage_source(usage: Usage) -> str:
    if usage.cached_tokens or usage.reasoning_tokens or usage.estimated:
        return repr(usage)
    return f"({usage.input_tokens}, {usage.output_tokens})"


def item_source(item: object) -> tuple[str, set[str]]:
    """Source for one script item, and the names it needs imported."""
    if isinstance(item, ModelResponse):
        names = {"reply"}
        parts = [repr(item.message.content)]
        for tool_call in item.message.tool_calls:
            source, helper = _call_source(tool_call)
            parts.append(source)
            names.add(helper)
        default = FinishReason.TOOL_CALLS if item.message.tool_calls else FinishReason.STOP
        if item.finish_reason is not default:
            parts.append(f"finish_reason=FinishReason.{item.finish_reason.name}")
            names.add("FinishReason")
        if item.usage is not None:
            parts.append(f"usage={_usage_source(item.usage)}")
            if "Usage(" in parts[-1]:
                names.add("Usage")
        return f"reply({', '.join(parts)})", names
    if isinstance(item, ModelCallError):
        extra = f", retry_after_s={item.retry_after_s!r}" if item.retry_after_s is not None else ""
        return (
            f"ModelCallError({str(item)!r}, transient={item.transient!r}{extra})",
            {"ModelCallError"},
        )
    if isinstance(item, UnreadableError):
        return "UnreadableError()", {"UnreadableError"}
    if isinstance(item, asyncio.CancelledError):
        return f"CancelledError({_message(item)!r})", {"CancelledError"}
    if isinstance(item, BaseException):
        return f"{type(item).__name__}({_message(item)!r})", set()
    return repr(item), set()


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # an exception whose message cannot be read, on purpose
        return ""


def script_source(items: Iterable[object], indent: str = "    ") -> tuple[str, set[str]]:
    """The body of a ``ScriptedModel([...])`` list: one item per line, with a trailing comma."""
    lines: list[str] = []
    names: set[str] = set()
    for item in items:
        source, needed = item_source(item)
        lines.append(f"{indent}{source},")
        names |= needed
    return "\n".join(lines), names


_IMPORTS = {
    "FinishReason": "agent_fsm.messages",
    "Usage": "agent_fsm.messages",
    "ModelCallError": "agent_fsm.models.base",
    "FakeClock": "agent_fsm.testing",
    "ScriptedModel": "agent_fsm.testing",
    "ToolOutcome": "agent_fsm.testing",
    "call": "agent_fsm.testing",
    "raw_call": "agent_fsm.testing",
    "reply": "agent_fsm.testing",
    "with_tool_doubles": "agent_fsm.testing",
    "check_invariants": "agent_fsm.testing",
    "UnreadableError": "agent_fsm.testing",
    "FilePart": "agent_fsm.content",
    "ImagePart": "agent_fsm.content",
    "TextPart": "agent_fsm.content",
    "UserMessage": "agent_fsm.messages",
    "CancelledError": "asyncio",
}


def _imports(names: set[str]) -> str:
    by_module: dict[str, list[str]] = {}
    for name in sorted(names):
        by_module.setdefault(_IMPORTS[name], []).append(name)
    return "\n".join(
        f"from {module} import {', '.join(sorted(found))}"
        for module, found in sorted(by_module.items())
    )


def reproducer(
    played: Sequence[object],
    *,
    user_input: UserInput,
    tools: Mapping[str, Sequence[ToolOutcome]] | None = None,
    aborted_at: int | None = None,
) -> str:
    """A script that replays ``played`` (what each model request got, in order).

    A trailing "behaviour exhausted" error is left out: an exhausted ``ScriptedModel`` fails
    the same way (a permanent model error).
    """
    items = list(played)
    if items and items[-1] is EXHAUSTED:
        items.pop()
    body, names = script_source(items)
    names |= {"FakeClock", "ScriptedModel", "check_invariants"}
    if not isinstance(user_input, str):  # images or files: their reprs are their sources
        shown = repr(user_input)
        names |= {n for n in ("FilePart", "ImagePart", "TextPart", "UserMessage") if n in shown}
    lines = ["model = ScriptedModel(["]
    if aborted_at is not None:
        lines.append(f"    # the test aborted the run during model request {aborted_at}")
    lines += [
        *([body] if body else []),
        "])",
        "clock = FakeClock()",
        "replayed = agent.replace(model=model, clock=clock, sleep=clock.sleep)",
    ]
    if tools:
        names |= {"ToolOutcome", "with_tool_doubles"}
        doubles = ", ".join(f"{name!r}: {list(outcomes)!r}" for name, outcomes in tools.items())
        lines.append(f"replayed = with_tool_doubles(replayed, {{{doubles}}})")
    lines += [
        "events = []",
        "replayed = replayed.subscribe(events.append)",
        f"result = replayed.run_sync({user_input!r})",
        "check_invariants(result, limits=replayed.limits, bound=replayed.bound, events=events)",
    ]
    return _imports(names) + "\n\n" + "\n".join(lines) + "\n"
