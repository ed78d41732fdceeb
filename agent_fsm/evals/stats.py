"""The arithmetic of an eval: how sure a pass rate is, and how runs spread.

A pass rate from a handful of runs is uncertain, and the report must say how much. The
interval is Wilson's score interval (Wilson 1927; recommended by Newcombe 1998 and by Brown,
Cai and DasGupta 2001 over the textbook ``p ± z·sqrt(p(1-p)/n)``, which collapses to a point at
0/n and n/n and can leave [0, 1]). Two rates are compared with Newcombe's hybrid score
interval for a difference of proportions (Newcombe 1998, method 10), built from the two
Wilson intervals: a drop is real when that interval lies wholly below zero.

Quantiles interpolate linearly between order statistics (``statistics.quantiles``'
``inclusive`` method), so the median of an even count is the midpoint and p90 of one value
is that value.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Interval", "Spread", "difference_interval", "quantile", "spread", "wilson_interval"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class Interval(BaseModel):
    """A confidence interval of a proportion (or of a difference of two)."""

    model_config = _FROZEN

    low: float
    """The lower bound."""
    high: float
    """The upper bound."""

    def __contains__(self, value: float) -> bool:
        return self.low - 1e-12 <= value <= self.high + 1e-12

    def __str__(self) -> str:
        return f"[{self.low:.2f}, {self.high:.2f}]"


def _z(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    return statistics.NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> Interval:
    """Wilson's score interval of ``successes`` out of ``trials``, at ``confidence``.

    It always lies within [0, 1] and holds the observed rate; with no trials it is [0, 1]
    (nothing is known).

    Raises:
        ValueError: for counts that are negative or more successes than trials.
    """
    if trials < 0 or not 0 <= successes <= trials:
        raise ValueError(f"{successes} successes out of {trials} trials is not a proportion")
    if trials == 0:
        return Interval(low=0.0, high=1.0)
    z = _z(confidence)
    p = successes / trials
    z2n = z * z / trials
    centre = (p + z2n / 2) / (1 + z2n)
    half = z / (1 + z2n) * math.sqrt(p * (1 - p) / trials + z2n / (4 * trials))
    # the exact bounds at 0/n and n/n are 0 and 1; rounding must not move them past p
    low = 0.0 if successes == 0 else max(0.0, min(p, centre - half))
    high = 1.0 if successes == trials else min(1.0, max(p, centre + half))
    return Interval(low=low, high=high)


def difference_interval(
    successes: int, trials: int, base_successes: int, base_trials: int, confidence: float = 0.95
) -> Interval:
    """Newcombe's hybrid score interval of ``p - p_base`` (method 10 of Newcombe 1998):
    each rate's distance to its own Wilson bound, combined in quadrature.

    Used by the regression gate: the current rate is below the baseline's beyond their joint
    uncertainty when the whole interval is below zero.
    """
    p = successes / trials if trials else 0.0
    q = base_successes / base_trials if base_trials else 0.0
    one = wilson_interval(successes, trials, confidence)
    two = wilson_interval(base_successes, base_trials, confidence)
    difference = p - q
    low = difference - math.sqrt((p - one.low) ** 2 + (two.high - q) ** 2)
    high = difference + math.sqrt((one.high - p) ** 2 + (q - two.low) ** 2)
    return Interval(low=max(-1.0, low), high=min(1.0, high))


def quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0 to 1) of ``values``, interpolated; None for no values."""
    if not 0 <= q <= 1:
        raise ValueError(f"a quantile is between 0 and 1, got {q}")
    ordered = sorted(values)
    if not ordered:
        return None
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


class Spread(BaseModel):
    """How one measure (tokens, cost, latency, turns) spread over runs."""

    model_config = _FROZEN

    count: int = Field(ge=0)
    """Runs measured."""
    median: float | None = None
    p90: float | None = None
    total: float = 0.0
    """The sum over the runs (tokens and cost add up; latency adds to the time spent)."""


def spread(values: Sequence[float]) -> Spread:
    """The median, p90 and total of ``values``."""
    return Spread(
        count=len(values),
        median=quantile(values, 0.5),
        p90=quantile(values, 0.9),
        total=float(sum(values)),
    )
