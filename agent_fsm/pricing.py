"""What a model's tokens cost: one price type, shared by the money budget and eval reports.

``Pricing`` prices one model's tokens per million, by kind: input, the part of the input a
prompt cache served, output, and the part of the output spent on hidden reasoning. A
``Limits(cost_budget=..., prices={...})`` holds one per model name; ``agent_fsm.evals``
prices a report's trials with the same type.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from agent_fsm.messages import Usage

__all__ = ["Pricing"]


class Pricing(BaseModel):
    """What one model's tokens cost, in any currency per million tokens. Frozen."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    input_per_million: float = Field(ge=0)
    """Prompt tokens."""
    output_per_million: float = Field(ge=0)
    """Completion tokens (reasoning included, unless ``reasoning_per_million`` says)."""
    cached_input_per_million: float | None = Field(default=None, ge=0)
    """For the part of the input served from a prompt cache; the input price when None."""
    reasoning_per_million: float | None = Field(default=None, ge=0)
    """For the part of the output spent on hidden reasoning; the output price when None."""

    def cost(self, usage: Usage) -> float:
        """The cost of ``usage``: every kind of token at its own price. Cached tokens are
        part of the input, reasoning tokens part of the output (``Usage``), so each is taken
        out of its whole at the whole's price and priced at its own (clamped to the whole:
        a server that reports more cached tokens than input is not paid back)."""
        cached = min(usage.cached_tokens, usage.input_tokens)
        reasoning = min(usage.reasoning_tokens, usage.output_tokens)
        cached_price = self.cached_input_per_million
        reasoning_price = self.reasoning_per_million
        if cached_price is None:
            cached, cached_price = 0, 0.0
        if reasoning_price is None:
            reasoning, reasoning_price = 0, 0.0
        return (
            (usage.input_tokens - cached) * self.input_per_million
            + cached * cached_price
            + (usage.output_tokens - reasoning) * self.output_per_million
            + reasoning * reasoning_price
        ) / 1_000_000

    @property
    def most_per_input_token(self) -> float:
        """The most one prompt token may cost (cached or not): what the budget's check
        before a call prices the estimated prompt at."""
        return max(self.input_per_million, self.cached_input_per_million or 0.0) / 1_000_000
