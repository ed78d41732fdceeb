"""Limits: every budget that bounds a run, validated once, with finite defaults.

Every field has a finite default on purpose: a run with default limits still provably ends.
Invalid values raise ``ConfigError`` at construction, naming each bad field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from agent_fsm.errors import ConfigError
from agent_fsm.pricing import Pricing

__all__ = ["Limits"]


_MONEY_SLACK = 1.0 - 1e-9
"""What share of a money budget counts as all of it (``Limits.money_spent``)."""


class Limits(BaseModel):
    """The budgets of one run. Frozen; share one instance between agents freely."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    """Every budget finite: an infinite timeout or backoff is no bound (NaN even less)."""

    max_turns: int = Field(default=20, ge=1)
    """Most turns (model calls that are not retries) a run may make. Bounds every run,
    together with ``model_retries_per_run``."""
    token_budget: int = Field(default=200_000, ge=1)
    """Most tokens (input + output, summed over all model calls) a run may spend. Checked
    before each call against an estimate of the prompt, and after it against reported usage,
    so it is overshot by at most the one call in flight."""
    context_window: int | None = Field(default=None, ge=1)
    """Most tokens the model takes in one call, prompt and reply together; None when not
    known (``Agent`` then asks the model for its ``context_window``). Before every call the
    prompt, by the calibrated estimate, must fit in it with ``reply_tokens`` to spare: when
    it does not, the agent's context policies shrink it (COMPACT), and when nothing can, the
    run stops with ``context_window`` before the call, not after the server's 400."""
    reply_tokens: int = Field(default=1_024, ge=0)
    """Tokens of the context window kept free for the reply."""
    compact_to: float = Field(default=0.75, gt=0.0, le=1.0)
    """What share of the room for the prompt (the window less ``reply_tokens``) compaction
    aims to leave it at, so that the next turns fit without compacting again: every
    compaction changes what is sent early in the prompt, which a provider's prompt cache
    then misses. Only a prompt that exceeds the room itself stops the run."""
    cost_budget: float | None = Field(default=None, gt=0)
    """Most money (in the currency of ``prices``) a run may spend on model calls, its
    sub-agents' included; None for no money budget. Checked before each call against the
    estimated prompt priced at the highest input price known, and after it against the
    reported usage priced by ``prices``, so it is overshot by at most the one call in flight.
    Needs a price for the agent's model. It has no last answer: a run out of money makes no
    more calls."""
    prices: tuple[tuple[str, Pricing], ...] = ()
    """What each model's tokens cost, by model name (``Model.name``): given as a mapping,
    ``{"gpt-4o-mini": Pricing(input_per_million=0.15, output_per_million=0.6)}``, kept as
    sorted pairs (limits are hashable). With prices, every run reports its ``cost``."""
    last_answer: bool = False
    """When the token budget, ``max_turns``, the time limit or loop detection ends the run,
    first make one more model call, without tools, asking for the best answer from what the
    run has (LAST_ANSWER). The run still ends with the stop that fired, and ``output`` holds
    that answer. The call is beyond the limit that fired (one call past ``max_turns``, its
    tokens past the budget, up to ``last_answer_timeout_s`` past the time limit); the
    termination bound counts it."""
    last_answer_timeout_s: float = Field(default=60.0, gt=0)
    """Seconds the last answer may take (the run's own time may be up already)."""
    max_consecutive_errors: int = Field(default=3, ge=1)
    """Turns whose tool calls all failed, in a row, before the run stops. A successful tool
    call resets the count. (Failed model calls have their own bound: ``model_retries``.)"""
    output_retries: int = Field(default=3, ge=0)
    """Final answers that did not validate against ``Agent(output_type=...)``, sent back to the
    model with the errors, before the run stops in ERROR ``invalid_output``. Each correction
    is a model call, counted as a turn."""
    guardrail_rewrites: int = Field(default=2, ge=0)
    """Rewrites of a final answer the output guardrails may ask for (``Rewrite``), over
    the run; one more, and the guardrail trips. Each rewrite is a model call, counted as a
    turn."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Wall-clock seconds a run may take, checked at every REFLECT."""
    tool_timeout_s: float = Field(default=60.0, gt=0)
    """Seconds one tool call may take before it is answered with a timeout error."""
    tool_max_output_chars: int = Field(default=20_000, ge=1)
    """Longest output of one tool call sent to the model; longer output is cut, with a note
    saying how much was cut. ``Tool(max_output_chars=...)`` overrides it per tool."""
    turn_max_output_chars: int = Field(default=60_000, ge=1)
    """Longest combined output of one turn's tool calls; when they exceed it, the longest
    are cut so that each gets a fair share."""
    max_parallel_tools: int = Field(default=8, ge=1)
    """Most tool calls of one reply that run at the same time."""
    tool_max_retries: int = Field(default=2, ge=0)
    """Retries of an idempotent tool call that failed with a transient error (its tool's
    ``retry_on``); ``Tool(max_retries=...)`` overrides it. Other tools are never retried."""
    model_retries: int = Field(default=6, ge=0)
    """Retries of one model call that failed with a transient error (unreachable server,
    dropped connection, timeout, 429, 5xx, a garbled reply) before the run stops with
    ``model_error``. A retry is no turn: ``max_turns`` counts real turns."""
    model_retries_per_run: int = Field(default=12, ge=0)
    """Retries of failed model calls in the whole run, every turn and resume together; with
    ``max_turns`` it bounds the model calls of a run (``Agent.bound``)."""
    retry_wait_s: float = Field(default=30.0, ge=0)
    """Most seconds one turn spends waiting between retries of its model call: a brief
    outage is ridden out, a long one ends the run. A retry whose backoff would pass it is
    not made."""
    retry_after_max_s: float = Field(default=30.0, ge=0)
    """Longest wait a server's ``Retry-After`` can ask for; a longer one is cut to this."""
    retry_backoff_s: float = Field(default=0.5, ge=0)
    """First delay before retrying a failed model call or an idempotent tool call; doubles on
    each retry, with jitter."""
    retry_backoff_max_s: float = Field(default=8.0, ge=0)
    """Upper bound of one retry delay."""
    loop_threshold: int = Field(default=3, ge=2)
    """k: the same call in this many tool turns in a row, the same turn results or the same
    text this many times in a row, or a cycle of turns repeated this many times, is a loop.
    Turns count, not calls: the calls of one reply are a fan-out, never a loop by
    themselves."""
    loop_max_period: int = Field(default=4, ge=0)
    """p: the longest cycle of tool turns (A,B,A,B,… has period 2) that loop detection looks
    for; 0 or 1 turns cycle detection off (repeats of one call are still caught)."""
    loop_detection: bool = True
    """Turn loop detection off entirely (for example for polling tools)."""
    loop_ladder: bool = False
    """Climb a ladder before loop detection stops the run: the first loop found sends the
    model a nudge (a message saying it repeats itself), the second withholds the repeated
    tool for the rest of the run, the third ends the run (with its last answer under
    ``last_answer``). Each rung is a row of the table; each costs turns like any other."""

    _most_per_input_token: float = PrivateAttr(default=0.0)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'limits'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ConfigError(f"invalid Limits: {problems}") from None

    @model_validator(mode="before")
    @classmethod
    def _no_bools_for_numbers(cls, data: Any) -> Any:
        """``max_turns=True`` is a mistake, not 1: a number field takes no True/False."""
        if isinstance(data, dict):
            wrong = [
                name
                for name, value in data.items()
                if isinstance(value, bool)
                and name in cls.model_fields
                and cls.model_fields[name].annotation is not bool
            ]
            if wrong:
                raise ValueError(f"{', '.join(wrong)} must be a number, not True or False")
        return data

    def model_backoff_ceiling_s(self, retry: int, retry_after_s: float | None) -> float:
        """The longest pause before model retry number ``retry`` (1-based): the backoff's
        ceiling (``retry_backoff_s`` doubled per retry, at most ``retry_backoff_max_s``), or
        the server's ``Retry-After`` (at most ``retry_after_max_s``) when that is longer. The
        pause taken is jittered below the backoff's ceiling, but never shorter than the
        capped Retry-After, so it never exceeds this."""
        backoff = min(self.retry_backoff_max_s, self.retry_backoff_s * 2.0 ** (retry - 1))
        return max(backoff, min(retry_after_s or 0.0, self.retry_after_max_s))

    @model_validator(mode="before")
    @classmethod
    def _prices_as_pairs(cls, data: Any) -> Any:
        """``prices`` given as a mapping is kept as sorted (name, Pricing) pairs."""
        if isinstance(data, dict) and isinstance(data.get("prices"), Mapping):
            data = {**data, "prices": tuple(sorted(data["prices"].items()))}
        return data

    def price_of(self, model: str) -> Pricing | None:
        """The price of ``model``'s tokens, or None when ``prices`` names no such model."""
        for name, pricing in self.prices:
            if name == model:
                return pricing
        return None

    def money_spent(self, spent: float) -> bool:
        """Whether ``spent`` reaches ``cost_budget`` (False without one). Amounts within a
        billionth of the budget reach it: sums of prices in floating point round differently
        with the order they are added in, and a parent counts its children's costs one way
        while a child counts against what was carved for it (0.2 - 0.04 - 0.12 is
        0.04000000000000001), so without the slack a child could see money left that its
        parent sees spent, and make a call the tree cannot pay for."""
        budget = self.cost_budget
        return budget is not None and spent >= budget * _MONEY_SLACK

    @property
    def most_per_input_token(self) -> float:
        """The highest price of one prompt token among ``prices``: what the check before a
        call prices the estimated prompt at (``prompt_exceeds_cost_budget``)."""
        return self._most_per_input_token

    @model_validator(mode="after")
    def _backoff_order(self) -> Limits:
        if self.retry_backoff_max_s < self.retry_backoff_s:
            raise ValueError("retry_backoff_max_s must be >= retry_backoff_s")
        if self.context_window is not None and self.reply_tokens >= self.context_window:
            raise ValueError(
                f"reply_tokens ({self.reply_tokens}) must be below context_window "
                f"({self.context_window}): no prompt would fit"
            )
        names = [name for name, _ in self.prices]
        if len(set(names)) != len(names):
            raise ValueError(f"prices names a model twice: {names}")
        if self.cost_budget is not None and not self.prices:
            raise ValueError("cost_budget needs prices: what each model's tokens cost")
        self._most_per_input_token = max(
            (pricing.most_per_input_token for _, pricing in self.prices), default=0.0
        )
        return self
