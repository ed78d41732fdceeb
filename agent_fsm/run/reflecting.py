"""REFLECT: the agent's optional reflector judges the turn; the REFLECT guards do the rest."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable

from agent_fsm.failures import describe, is_own_failure
from agent_fsm.run.context import Reflector, RunContext
from agent_fsm.views import view_of

__all__ = ["reflect"]


def reflect(ctx: RunContext) -> Awaitable[None] | None:
    """REFLECT's work: ask the agent's reflector, when it has one and no control tool ended the
    turn, whether the task is done (``reflector_says_done``). Without one there is nothing to
    await, and nothing is returned."""
    state, reflector = ctx.state, ctx.config.reflector
    state.reflector_done = False
    if reflector is None or state.requests:
        return None
    return _ask(ctx, reflector)


async def _ask(ctx: RunContext, reflector: Reflector) -> None:
    """A reflector that raises is a bug in a hook, not in the run: it is logged with its
    traceback and its verdict is "not done", so the budgets still end the run. It reads a
    read-only view of the run (``views.view_of``): one that tries to change it raises, and
    is logged the same way."""
    try:
        verdict = reflector(view_of(ctx.state))
        if inspect.isawaitable(verdict):
            verdict = await verdict
        done = bool(verdict)
    except BaseException as exc:
        if not is_own_failure(exc):
            raise
        ctx.log.warning("reflector_failed", turn=ctx.state.turns, error=describe(exc), exc_info=exc)
        done = False
    ctx.state.reflector_done = done
