"""REFLECT: the agent's optional reflector judges the turn; the REFLECT guards do the rest."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable

from agent_fsm.run.context import Reflector, RunContext

__all__ = ["reflect"]


def reflect(ctx: RunContext) -> Awaitable[None] | None:
    """REFLECT's work: ask the agent's reflector, when it has one and no control tool ended the
    turn, whether the task is done (``reflector_says_done``). Without one there is nothing to
    await, and nothing is returned."""
    state, reflector = ctx.state, ctx.config.reflector
    state.reflector_done = False
    if reflector is None or state.control is not None:
        return None
    return _ask(ctx, reflector)


async def _ask(ctx: RunContext, reflector: Reflector) -> None:
    verdict = reflector(ctx.state)
    if inspect.isawaitable(verdict):
        verdict = await verdict
    ctx.state.reflector_done = bool(verdict)
