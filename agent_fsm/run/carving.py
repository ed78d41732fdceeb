"""What a sub-agent may spend: its limits carved from what its parent has left.

``carve`` gives a child started now (or going on after a pause) each budget as the smaller of
its own and what remains of its parent's (turns, retries, tokens, money, time); ``carved_config``
is the child's configuration under those limits. ``run.delegation`` runs the child with
them, and the harness checks each child's run against them (``Delegate.observer``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from pydantic import BaseModel, JsonValue

from agent_fsm.limits import Limits
from agent_fsm.messages import Usage
from agent_fsm.run.context import RunConfig, RunContext

__all__ = ["LimitsLeft", "carve", "carved_config"]

_COST_GUARDS = frozenset({"prompt_exceeds_cost_budget", "cost_budget_spent"})


class LimitsLeft(BaseModel):
    """What a parent run has left when a child starts (``carve``), or why nothing is."""

    limits: Limits | None
    """The child's limits; None when the parent has nothing left to give."""
    why_not: str = ""
    """Which budget the parent has spent, when ``limits`` is None."""


def carve(
    own: Limits, parent: RunContext | None, counted: Mapping[str, JsonValue] | None = None
) -> LimitsLeft:
    """The limits of a child started now by ``parent``: each budget the smaller of the
    child's own and what remains of the parent's (turns, retries, tokens, money, time), the
    parent's prices added to the child's (its own win). A last answer is kept only when a
    turn is left for it beyond one turn of work. Without a parent: its own limits.

    A child that goes on after a pause has spent ``counted`` already, which its parent
    counted: each of its budgets is then that spend plus what the parent has left (at
    most its own), so across the pause it still never outspends its parent."""
    if parent is None:
        return LimitsLeft(limits=own)
    state, limits = parent.state, parent.limits
    earlier = parent.finished_children  # this step's, not counted in the state yet
    turns = limits.max_turns - state.turns - sum(max(c.turns + c.last_answers, 1) for c in earlier)
    tokens = (
        limits.token_budget - state.usage.total_tokens - sum(c.usage.total_tokens for c in earlier)
    )
    retries = max(limits.model_retries_per_run - state.retries - sum(c.retries for c in earlier), 0)
    elapsed = parent.clock() - parent.started_at
    seconds = limits.timeout_s - elapsed
    money: float | None = None
    spent_money = 0.0
    if limits.cost_budget is not None:
        spent_money = (state.cost or 0.0) + sum(c.cost or 0.0 for c in earlier)
        money = limits.cost_budget - spent_money
    for spent, why in (
        (turns < 1, "no turns"),
        (tokens < 1, "no tokens"),
        (money is not None and limits.money_spent(spent_money), "no money"),
        (seconds <= 0, "no time"),
    ):
        if spent:
            return LimitsLeft(limits=None, why_not=why)
    before = counted or {}
    spent_turns = _count_of(before, "turns") + _count_of(before, "last_answers")
    spent_usage = before.get("usage")
    spent_tokens = 0
    if isinstance(spent_usage, dict):
        spent_tokens = Usage.model_validate(spent_usage).total_tokens
    spent_cost = before.get("cost")
    last_answer = own.last_answer and turns >= 2
    max_turns = min(own.max_turns, spent_turns + (turns - 1 if last_answer else turns))
    tokens += spent_tokens
    retries += _count_of(before, "retries")
    if money is not None and isinstance(spent_cost, int | float):
        money += float(spent_cost)
    cost_budget = own.cost_budget
    if money is not None:
        cost_budget = money if cost_budget is None else min(cost_budget, money)
    prices = dict(limits.prices) | dict(own.prices)
    values = {
        **own.model_dump(exclude={"prices"}),
        "max_turns": max_turns,
        "last_answer": last_answer,
        "token_budget": min(own.token_budget, tokens),
        "model_retries_per_run": min(own.model_retries_per_run, retries),
        "timeout_s": min(own.timeout_s, seconds),
        "cost_budget": cost_budget,
        "prices": prices,
    }
    return LimitsLeft(limits=Limits(**values))


def _count_of(spent: Mapping[str, JsonValue], key: str) -> int:
    """A count of a child's recorded spend, as a non-negative int (0 when it is not)."""
    value = spent.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def carved_config(config: RunConfig, limits: Limits) -> RunConfig:
    """The child's configuration under carved ``limits``: priced by them when its own were
    not, and with the rows the carve turned on (a money budget, no last answer) live."""
    pricing = config.pricing or limits.price_of(config.model.name)
    dead = set(config.dead_guards)
    if limits.cost_budget is not None:
        dead -= _COST_GUARDS
    if not limits.last_answer:
        dead.add("last_answer_wanted")
    return replace(config, limits=limits, pricing=pricing, dead_guards=frozenset(dead))
