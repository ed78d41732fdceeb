"""Per-step hooks: user code that sees, and may change, each model call and each tool call.

``Agent(hooks=StepHooks(...))`` takes up to three hooks, each a plain or an async function:

* ``before_model(plan) -> ModelPlan | None`` runs before each turn's model call (a retry of
  the call included): the plan holds the model, the messages (the prompt as the context rules
  made it), the tools offered and ``tool_choice``. A changed plan is checked (``plan_problem``;
  ``run.thinking`` adds that the prompt must still fit the context window) before it is
  sent; None keeps the plan. The transcript never changes: only what this call is sent.
  The tools offered are what the model is shown, not a permission: a call the model makes
  anyway of an agent's tool it was not offered is answered as any call is (``before_tool``
  is where a call is refused). The offer is not checkpointed, so holding calls to it would
  differ between a run and the same run resumed after a crash.
* ``before_tool(call, arguments) -> None | Deny | dict`` runs before a valid call of a user
  tool is gated for approval and run: None lets it go on, ``Deny(reason=...)`` answers it with
  an error the model reads (it is not run), and a dict replaces its arguments, which are
  validated again; the answer records the change (``details["runtime"]
  ["arguments_changed"]``), and the call that runs (events, approvals, the journal) carries
  the new arguments.
* ``after_tool(call, result) -> ToolMessage | None`` runs on the answer of every call that
  ran: a returned ``ToolMessage`` replaces it (same call id and name; status ok or error),
  marked ``details["runtime"]["result_changed"]``; None keeps it.

``tools.hooks`` runs the tool hooks and ``run.acting`` decides which calls they see; this
module holds the public types and the ``before_model`` rules.

Not hooked, because they are the engine's protocol with the model and decide how the run
ends: the control tools (``ask_user``, ``finish_task``), the typed-output tool
(``final_result``), the summary call a context policy asks for, and the last answer.

A hook can never break the transcript: every tool call still gets exactly one answer, and a
changed prompt must keep the context rules. Its failures are data, never exceptions out of
``run()`` (anything but the run's own cancellation and ``KeyboardInterrupt``, as for tools):

* ``before_model`` raising, or returning what breaks a rule, fails the model call as a
  ``ModelFailure`` whose message starts "before_model hook failed": an exception is retried
  when a model's would be (``TimeoutError``, ``ConnectionError``), anything else is permanent
  and ends the run in ERROR ``model_error``;
* a tool hook failing answers its call with an error naming the hook, fail safe: a failed
  ``before_tool`` means the call is not run, a failed ``after_tool`` withholds the output.

An async tool hook must answer within the tool's timeout; an async ``before_model`` is
bounded by the run's own time limit, as the model call is. A sync hook runs on the event loop
and cannot be timed out: keep it quick.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agent_fsm.errors import ConfigError
from agent_fsm.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolMessage,
    ToolSpec,
    UserMessage,
    clean_message,
)
from agent_fsm.models.base import Model, ModelCallError
from agent_fsm.tools.hooks import AfterTool, BeforeTool, Deny, HookFailed, ToolDecision, call_hook
from agent_fsm.tools.tool import ToolRegistry

__all__ = [
    "AfterTool",
    "BeforeModel",
    "BeforeTool",
    "Deny",
    "ModelPlan",
    "StepHooks",
    "ToolChoice",
    "ToolDecision",
    "messages_problem",
    "plan_call",
    "plan_problem",
]

ToolChoice = str
"""``"auto"`` (the model decides), ``"required"`` (it must call a tool), ``"none"`` (it must
not), or the name of one offered tool, which it must call. The three words mean the modes."""

_MESSAGE_TYPES = (SystemMessage, UserMessage, AssistantMessage, ToolMessage)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelPlan:
    """One model call as the engine plans it; ``before_model`` may return a changed copy
    (``dataclasses.replace(plan, ...)``)."""

    model: Model
    """The model to call; any ``Model``."""
    messages: Sequence[Message]
    """The prompt, oldest first, as the context rules made it (read-only: return a new
    sequence to change it). It must keep the rules: the system prompt first and unchanged,
    the latest user input kept, every tool call followed by its results."""
    tools: tuple[ToolSpec, ...]
    """The tools offered: a subset of the agent's (``agent.registry.specs``), unchanged."""
    tool_choice: ToolChoice | None = None
    """What the model must do with the tools (``ToolChoice``); None leaves it to the model's
    own settings (by default the provider's: ``"auto"``)."""
    run_id: str
    """The run (read-only)."""
    turn: int
    """The turn this call makes (read-only)."""
    retry: int = 0
    """0 for the turn's first call, n for its n-th retry after a failed call (read-only)."""
    last_error: str | None = None
    """Why the previous model call failed, when this one follows a failure (read-only): a
    hook may choose a fallback model."""


BeforeModel = Callable[[ModelPlan], ModelPlan | Awaitable[ModelPlan | None] | None]
"""``before_model(plan)``: the plan to send (None: ``plan`` as it is)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepHooks:
    """The per-step hooks of an agent (``Agent(hooks=...)``); set only those you need.

    A dataclass rather than a protocol to implement: a hook is one function, so an agent
    needs no class of its own, an unset hook costs nothing, and each is checked when the
    agent is built. Each may be sync or async (see the module docstring for what each may
    do, what is not hooked, and what a failure does).

    Raises:
        ConfigError: a hook that is neither None nor callable.
    """

    before_model: BeforeModel | None = None
    """Sees, and may change, each turn's model call (``ModelPlan``)."""
    before_tool: BeforeTool | None = None
    """Sees each valid call of a user tool before it is gated and run: None, ``Deny`` or
    new arguments."""
    after_tool: AfterTool | None = None
    """Sees the answer of each call that ran; may return a replacement ``ToolMessage``."""

    def __post_init__(self) -> None:
        for name in ("before_model", "before_tool", "after_tool"):
            hook = getattr(self, name)
            if hook is not None and not callable(hook):
                raise ConfigError(f"StepHooks({name}=...) must be callable, got {hook!r:.60}")

    @property
    def empty(self) -> bool:
        """No hook is set: the agent runs as if it had none."""
        return self.before_model is None and self.before_tool is None and self.after_tool is None


# -- before_model ------------------------------------------------------------------------


async def plan_call(hook: BeforeModel, plan: ModelPlan, registry: ToolRegistry) -> ModelPlan:
    """The plan ``hook`` makes of ``plan``, checked; ``plan`` itself when it changed nothing.

    Raises:
        ModelCallError: "before_model hook failed: ...": the hook raised (transient when a
            model's exception would be: ``TimeoutError``, ``ConnectionError``) or returned
            what breaks a rule (permanent).
    """
    try:
        answer = await call_hook(hook, None, plan)
    except HookFailed as failure:
        transient = isinstance(failure.original, TimeoutError | ConnectionError)
        raise ModelCallError(f"before_model hook failed: {failure}", transient=transient) from None
    if answer is None or answer is plan:
        return plan
    problem = plan_problem(plan, answer, registry)
    if problem is not None:
        raise ModelCallError(f"before_model hook failed: {problem}", transient=False)
    assert isinstance(answer, ModelPlan)
    return _normalised(plan, answer)


def _normalised(before: ModelPlan, after: ModelPlan) -> ModelPlan:
    """A checked plan as the request takes it: the tools a tuple, the texts clean."""
    changes: dict[str, Any] = {}
    if after.tools is not before.tools and not isinstance(after.tools, tuple):
        changes["tools"] = tuple(after.tools)
    if after.messages is not before.messages:
        changes["messages"] = [clean_message(message) for message in after.messages]
    return dataclasses.replace(after, **changes) if changes else after


def plan_problem(before: ModelPlan, after: object, registry: ToolRegistry) -> str | None:
    """Why ``after``, a hook's answer to ``before``, cannot be sent; None when it can.

    The rules: a ``ModelPlan`` for the same run, turn and retry; a ``Model``; tools that the
    agent has, as it describes them, each once (a tool it lacks could not be run, and a
    changed schema would not be the one its arguments are checked against); a
    ``tool_choice`` that names a mode or an offered tool; messages that keep the context
    rules (``messages_problem``).
    """
    if not isinstance(after, ModelPlan):
        return f"it returned {type(after).__name__}, not a ModelPlan or None"
    if (after.run_id, after.turn, after.retry, after.last_error) != (
        before.run_id,
        before.turn,
        before.retry,
        before.last_error,
    ):
        return "it changed run_id, turn, retry or last_error, which are the engine's"
    if after.model is not before.model and not _is_model(after.model):
        return f"its model {type(after.model).__name__} does not implement the Model protocol"
    if after.tools is not before.tools:
        problem = _tools_problem(after.tools, registry)
        if problem is not None:
            return problem
    problem = _choice_problem(after.tool_choice, after.tools)
    if problem is None and after.messages is not before.messages:
        problem = messages_problem(before.messages, after.messages)
    return problem


def _is_model(model: object) -> bool:
    return isinstance(model, Model) and inspect.iscoroutinefunction(model.request)


def _tools_problem(tools: object, registry: ToolRegistry) -> str | None:
    if not isinstance(tools, tuple | list):
        return f"its tools are a {type(tools).__name__}, not a tuple of ToolSpec"
    seen: set[str] = set()
    for spec in tools:
        if not isinstance(spec, ToolSpec):
            return f"its tools hold a {type(spec).__name__}, not a ToolSpec"
        own = registry.spec_of(spec.name)
        if own is None:
            return f"it offers the tool {spec.name!r}, which the agent does not have"
        if spec is not own and spec != own:
            return f"it changed the tool {spec.name!r}: offer the agent's own ToolSpec"
        if spec.name in seen:
            return f"it offers the tool {spec.name!r} twice"
        seen.add(spec.name)
    return None


def _choice_problem(choice: object, tools: Sequence[ToolSpec]) -> str | None:
    if choice is None or choice in ("auto", "none"):
        return None
    if not isinstance(choice, str):
        return f"its tool_choice is a {type(choice).__name__}, not a str or None"
    if choice == "required":
        return None if tools else "its tool_choice 'required' offers no tool to call"
    if not any(spec.name == choice for spec in tools):
        return (
            f"its tool_choice {choice!r} is neither 'auto', 'required' nor 'none', nor an "
            "offered tool"
        )
    return None


def messages_problem(before: Sequence[Message], after: object) -> str | None:
    """Why ``after`` cannot replace the prompt ``before``; None when it can.

    The context rules, as the engine keeps them itself (``prompt.py``): the system prompt
    first and unchanged, the latest user input kept, and every tool call answered by the
    next messages, once each and in order, with no result that answers no call. Anything
    else (messages added, dropped, rewritten) is the hook's to choose.
    """
    if isinstance(after, str) or not isinstance(after, Sequence):
        return f"its messages are a {type(after).__name__}, not a sequence of messages"
    for index, message in enumerate(after):
        if not isinstance(message, _MESSAGE_TYPES) or not isinstance(message.content, str):
            return f"its message {index} is no transcript message ({type(message).__name__})"
    if before and isinstance(before[0], SystemMessage) and (not after or after[0] != before[0]):
        return "its messages do not start with the system prompt, unchanged"
    latest = next((m for m in reversed(before) if isinstance(m, UserMessage)), None)
    if latest is not None and not any(m is latest or m == latest for m in after):
        return "its messages drop the latest user input"
    return _pairing_problem(after)


def _pairing_problem(messages: Sequence[Message]) -> str | None:
    """The first way ``messages`` separate a tool call from its result, if any."""
    owed: list[tuple[str, str]] = []  # (call id, name) still to be answered, in order
    for index, message in enumerate(messages):
        if isinstance(message, ToolMessage):
            if not owed:
                return f"its message {index} is a tool result that answers no call"
            call_id, name = owed.pop(0)
            if (message.tool_call_id, message.name) != (call_id, name):
                return f"its message {index} answers {message.tool_call_id!r}, not {call_id!r}"
            continue
        if owed:
            return f"its message {index} comes before calls {[c for c, _ in owed]} are answered"
        if isinstance(message, AssistantMessage) and message.tool_calls:
            owed = [(call.id, call.name) for call in message.tool_calls]
            ids = {call_id for call_id, _ in owed}
            if len(ids) != len(owed) or "" in ids:
                return f"its message {index} has empty or repeated tool call ids"
    if owed:
        return f"its messages leave calls {[c for c, _ in owed]} unanswered"
    return None
