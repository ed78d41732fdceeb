"""The arithmetic of evals (issue 38): Wilson's interval and Newcombe's interval of a
difference against the published values, their properties for every count, and quantiles."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_fsm.evals.stats import (
    difference_interval,
    quantile,
    spread,
    wilson_interval,
)

# Newcombe, "Two-sided confidence intervals for the single proportion: comparison of seven
# methods", Statistics in Medicine 17 (1998), table II, the score method without continuity
# correction (method 3), to four places.
WILSON_PUBLISHED = [
    (81, 263, 0.2553, 0.3662),
    (15, 148, 0.0624, 0.1605),
    (0, 20, 0.0000, 0.1611),
    (1, 29, 0.0061, 0.1718),
    (29, 29, 0.8830, 1.0000),
]

# Newcombe, "Interval estimation for the difference between independent proportions:
# comparison of eleven methods", Statistics in Medicine 17 (1998), table II, method 10.
DIFFERENCE_PUBLISHED = [
    (56, 70, 48, 80, 0.0524, 0.3339),
    (9, 10, 3, 10, 0.1705, 0.8090),
    (5, 56, 0, 29, -0.0381, 0.1926),
]


@pytest.mark.parametrize(("successes", "trials", "low", "high"), WILSON_PUBLISHED)
def test_wilson_matches_the_published_values(
    successes: int, trials: int, low: float, high: float
) -> None:
    interval = wilson_interval(successes, trials)
    assert (round(interval.low, 4), round(interval.high, 4)) == (low, high)


@pytest.mark.parametrize(("a", "n", "b", "m", "low", "high"), DIFFERENCE_PUBLISHED)
def test_the_difference_interval_matches_the_published_values(
    a: int, n: int, b: int, m: int, low: float, high: float
) -> None:
    interval = difference_interval(a, n, b, m)
    assert (round(interval.low, 4), round(interval.high, 4)) == (low, high)


def test_the_interval_at_other_confidences_and_with_no_trials() -> None:
    # 90%: z = 1.6449; by hand, (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)
    p, n, z = 0.8, 10, 1.6448536269514722
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    interval = wilson_interval(8, 10, confidence=0.90)
    assert interval.low == pytest.approx(centre - half)
    assert interval.high == pytest.approx(centre + half)
    assert wilson_interval(8, 10, 0.99).high > wilson_interval(8, 10, 0.95).high > interval.high
    assert (wilson_interval(0, 0).low, wilson_interval(0, 0).high) == (0.0, 1.0)
    with pytest.raises(ValueError, match="not a proportion"):
        wilson_interval(3, 2)
    with pytest.raises(ValueError, match="confidence"):
        wilson_interval(1, 2, confidence=1.0)


counts = st.integers(min_value=1, max_value=500).flatmap(
    lambda n: st.tuples(st.integers(min_value=0, max_value=n), st.just(n))
)
confidences = st.sampled_from([0.8, 0.9, 0.95, 0.99])


@settings(max_examples=500)
@given(counts, confidences)
def test_the_interval_holds_the_observed_rate_within_zero_and_one(
    count: tuple[int, int], confidence: float
) -> None:
    successes, trials = count
    interval = wilson_interval(successes, trials, confidence)
    assert 0.0 <= interval.low <= successes / trials <= interval.high <= 1.0
    assert successes / trials in interval
    # one more success never moves the interval down
    if successes < trials:
        more = wilson_interval(successes + 1, trials, confidence)
        assert more.low >= interval.low
        assert more.high >= interval.high


@settings(max_examples=500)
@given(counts)
def test_more_trials_at_the_same_rate_narrow_the_interval(count: tuple[int, int]) -> None:
    successes, trials = count
    small = wilson_interval(successes, trials)
    large = wilson_interval(successes * 4, trials * 4)
    assert large.high - large.low < small.high - small.low


@settings(max_examples=500)
@given(counts, counts)
def test_the_difference_interval_holds_the_observed_difference(
    one: tuple[int, int], two: tuple[int, int]
) -> None:
    difference = one[0] / one[1] - two[0] / two[1]
    interval = difference_interval(*one, *two)
    assert -1.0 <= interval.low <= difference <= interval.high <= 1.0


def test_quantiles_interpolate_between_order_statistics() -> None:
    assert quantile([], 0.5) is None
    assert quantile([7], 0.9) == 7
    assert quantile([4, 1, 3, 2], 0.5) == 2.5
    assert quantile(list(range(1, 11)), 0.9) == pytest.approx(9.1)
    assert quantile([1, 2], 0.0) == 1
    assert quantile([1, 2], 1.0) == 2
    summary = spread([3, 1, 2, 10])
    assert (summary.count, summary.median, summary.total) == (4, 2.5, 16.0)
    assert summary.p90 == pytest.approx(7.9)
