"""REFLECT: the agent's optional reflector judges the turn; the REFLECT guards do the rest."""

from __future__ import annotations

import inspect

from agent_fsm.run.context import RunContext

__all__ = ["reflect"]


async def reflect(ctx: RunContext) -> None:
    """REFLECT's work: ask the agent's reflector, when it has one and no control tool ended the
    turn, whether the task is done (``reflector_says_done``)."""
    state, reflector = ctx.state, ctx.config.reflector
    state.reflector_done = False
    if reflector is None or state.control is not None:
        return
    verdict = reflector(state)
    if inspect.isawaitable(verdict):
        verdict = await verdict
    state.reflector_done = bool(verdict)
