"""The benchmarks' interval for a median of paired differences (bench/paired.py)."""

from __future__ import annotations

import random

import pytest

from bench.paired import median_interval


def test_the_interval_is_the_order_statistics_binomial_coverage_gives():
    """n = 10 at 95%: x(2)..x(9) covers 97.9%, x(3)..x(8) only 89.1%; too few values
    for any such pair: the whole range."""
    assert median_interval([9, 1, 8, 2, 7, 3, 6, 4, 5, 10]) == (2, 9)
    assert median_interval([9, 1, 8, 2, 7, 3, 6, 4, 5, 10], confidence=0.89) == (3, 8)
    assert median_interval([3.0, -1.0]) == (-1.0, 3.0)
    assert median_interval([4.0]) == (4.0, 4.0)
    with pytest.raises(ValueError):
        median_interval([])


@pytest.mark.parametrize("shape", ["normal", "skewed"])
def test_the_interval_covers_the_true_median_as_often_as_it_claims(shape):
    """Drawn 2,000 times, 40 pairs each (a bench's default) from a distribution with a
    known median (a create's times are skewed: a long tail of slow ones), the interval
    misses it at most 5% of the time, and it narrows as pairs are added."""
    rng = random.Random(28)

    def draw(n: int) -> list[float]:
        if shape == "normal":
            return [rng.gauss(0.0, 3.0) for _ in range(n)]
        return [rng.expovariate(1.0) - 0.6931471805599453 for _ in range(n)]  # median 0

    missed = sum(
        not (lo <= 0.0 <= hi) for lo, hi in (median_interval(draw(40)) for _ in range(2000))
    )
    assert missed / 2000 <= 0.05
    width = [hi - lo for lo, hi in (median_interval(draw(n)) for n in (40, 400))]
    assert width[1] < width[0] / 2
