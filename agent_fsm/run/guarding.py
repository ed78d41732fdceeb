"""Guardrails at work: the checks run here, and the rows decide (``agent_fsm.guardrails``).

``screen_input`` runs in OBSERVE, on the user messages it took in, before anything else of
the turn; ``screen_output`` runs in THINK, on an answer that would end the run. Each records
what it found in the run state (``RunState.guardrail_trip``, or a rewrite as a
``correction``) and decides nothing: the ``input_guardrail_tripped`` and
``output_guardrail_tripped`` rows stop the run, the ``output_rejected`` row sends a rewrite
back to the model. Must not raise for anything a guardrail does (it trips instead).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

from agent_fsm.cancellation import StopScope
from agent_fsm.failures import describe, is_own_failure
from agent_fsm.guardrails import Guardrail, Rewrite, Trip
from agent_fsm.messages import ToolMessage, ToolStatus
from agent_fsm.run.context import RunContext
from agent_fsm.state import CONTROL_STOPS, ControlKind, GuardrailTrip
from agent_fsm.table import StopReason
from agent_fsm.tools.execution import run_in_thread

__all__ = ["NOT_ACCEPTED", "REWRITE_PROMPT", "screen_ending", "screen_input", "screen_output"]

REWRITE_PROMPT = (
    "Your answer was not accepted by the {guardrail} check: {instructions}\n"
    "Write your answer again."
)
"""The user message that asks for a rewrite; ``{guardrail}`` and ``{instructions}`` filled."""


async def _verdict(ctx: RunContext, guardrail: Guardrail, text: str) -> Trip | Rewrite | None:
    """What ``guardrail`` says of ``text``: None (passes), a Trip or a Rewrite. A guardrail
    that raises, returns anything else or overruns ``Limits.tool_timeout_s`` trips; a run
    stopped meanwhile (abort, deadline) gets None: its own rows stop it."""
    scope = StopScope(ctx.stop)
    try:
        with scope:
            work: Awaitable[object] = (
                guardrail.fn(text)  # type: ignore[assignment]  # is_async: a coroutine
                if guardrail.is_async
                else _threaded(guardrail, text)
            )
            verdict = await asyncio.wait_for(work, ctx.limits.tool_timeout_s)
    except TimeoutError:
        return Trip(f"it did not answer within {ctx.limits.tool_timeout_s:g} s")
    except BaseException as exc:
        if scope.stopped:
            return None
        if not is_own_failure(exc):
            raise  # the run's cancellation from outside, or a KeyboardInterrupt
        return Trip(f"it raised {describe(exc)}")
    if scope.stopped:
        return None
    if verdict is True or verdict is None:
        return None
    if verdict is False:
        return Trip("")
    if isinstance(verdict, Trip | Rewrite):
        return verdict
    return Trip(f"it returned {type(verdict).__name__}, not a verdict")


def _threaded(guardrail: Guardrail, text: str) -> asyncio.Future[object]:
    """A sync guardrail, on a worker thread (a slow one never holds the event loop)."""

    def check(text: str) -> object:
        return guardrail.fn(text)

    return run_in_thread(check, {"text": text})


async def _screen(
    ctx: RunContext, guardrails: Sequence[Guardrail], text: str, kind: str
) -> tuple[Guardrail, Trip | Rewrite] | None:
    """The first guardrail that does not pass ``text``, with its verdict."""
    for guardrail in guardrails:
        verdict = await _verdict(ctx, guardrail, text)
        if verdict is not None:
            if kind == "input" and isinstance(verdict, Rewrite):
                verdict = Trip(f"an input cannot be rewritten ({verdict.instructions})")
            return guardrail, verdict
    return None


async def screen_input(ctx: RunContext, texts: Sequence[str]) -> None:
    """Check each user message OBSERVE took in with the input guardrails, in order; the
    first that trips is recorded for the ``input_guardrail_tripped`` row."""
    guardrails = ctx.config.input_guardrails
    for text in texts:
        found = await _screen(ctx, guardrails, text, "input")
        if found is not None:
            guardrail, verdict = found
            reason = verdict.reason if isinstance(verdict, Trip) else ""
            ctx.state.guardrail_trip = GuardrailTrip(
                kind="input", guardrail=guardrail.name, reason=reason
            )
            return


async def screen_output(ctx: RunContext, text: str, *, rewrite: bool = True) -> bool:
    """Check an answer that would end the run with the output guardrails: a trip is recorded
    for the ``output_guardrail_tripped`` row; a rewrite becomes the correction the
    ``output_rejected`` row sends back, while ``Limits.guardrail_rewrites`` allows, and a
    trip after that (at once when no ``rewrite`` can be: a last answer, the run's last call).
    True when a rewrite was asked for."""
    found = await _screen(ctx, ctx.config.output_guardrails, text, "output")
    if found is None:
        return False
    state = ctx.state
    guardrail, verdict = found
    if isinstance(verdict, Rewrite) and not rewrite:
        reason = f"a last answer cannot be rewritten ({verdict.instructions})"
    elif isinstance(verdict, Rewrite):
        if state.guardrail_rewrites < ctx.limits.guardrail_rewrites:
            state.guardrail_rewrites += 1
            state.correction = REWRITE_PROMPT.format(
                guardrail=guardrail.name, instructions=verdict.instructions
            )
            return True
        reason = (
            f"still asking for a rewrite after {ctx.limits.guardrail_rewrites} "
            f"({verdict.instructions})"
        )
    else:
        reason = verdict.reason
    state.guardrail_trip = GuardrailTrip(kind="output", guardrail=guardrail.name, reason=reason)
    return False


_SCREENED_KINDS = (ControlKind.FINISH_TASK, ControlKind.TERMINAL_TOOL)


async def screen_ending(ctx: RunContext) -> None:
    """After ACT: when the request that would end the run is a finish_task summary or a
    terminal tool's output (the first the REFLECT rows rank: ``AgentMachine.control_order``),
    check it with the output guardrails. A trip is recorded for the REFLECT row; a rewrite
    withdraws the request (the run goes on, the correction observed next, and a terminal
    tool's answer no longer says it ends the run)."""
    state = ctx.state
    requests = state.requests
    if not requests:
        return
    order = ctx.config.machine.control_order
    first = min(requests, key=lambda request: _rank(order, request.kind))
    if first.kind not in _SCREENED_KINDS:
        return
    if await screen_output(ctx, first.text):
        state.requests = [request for request in requests if request is not first]
        _not_ending(ctx, first.tool_call_id)


def _rank(order: Sequence[StopReason], kind: ControlKind) -> int:
    stop = CONTROL_STOPS[kind]
    return order.index(stop) if stop in order else len(order)


def _not_ending(ctx: RunContext, call_id: str) -> None:
    """The answer of the call whose request was withdrawn, in this turn's results, no longer
    says it ends the run: a finish_task call is answered as not accepted (the correction,
    observed next, says why), a terminal tool's answer loses its ``ends_run`` mark."""
    messages = ctx.state.messages
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if not isinstance(message, ToolMessage):
            return
        if message.tool_call_id != call_id:
            continue
        details = message.details
        runtime = details.get("runtime") if isinstance(details, dict) else None
        if isinstance(details, dict) and isinstance(runtime, dict) and "ends_run" in runtime:
            kept = {key: value for key, value in runtime.items() if key != "ends_run"}
            rest = {key: value for key, value in details.items() if key != "runtime"}
            update = {**rest, "runtime": kept} if kept else rest
            messages[index] = message.model_copy(update={"details": update or None})
        elif message.status is ToolStatus.OK:  # finish_task's "marked as finished"
            messages[index] = message.model_copy(
                update={"content": NOT_ACCEPTED, "status": ToolStatus.ERROR}
            )
        return


NOT_ACCEPTED = "The task was not marked as finished: the summary was not accepted (see below)."
"""The answer of a finish_task call whose summary an output guardrail sent back."""
