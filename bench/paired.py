"""Paired figures: rounds interleave the cases, so each round's pair shares the machine's
state of that moment; medians of per-pair ratios and differences cancel its drift."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from math import comb


def median_ratio(values: Iterable[float], base: Iterable[float]) -> float:
    """The median of each pair's ratio ``value / base``."""
    return statistics.median(v / b for v, b in zip(values, base, strict=True))


def median_added(values: Iterable[float], base: Iterable[float]) -> float:
    """The median of each pair's difference ``value - base``."""
    return statistics.median(v - b for v, b in zip(values, base, strict=True))


def median_interval(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median of ``values`` (paired differences):
    the order statistics ``x(j)`` and ``x(n-j+1)`` with the largest ``j`` whose coverage,
    ``1 - 2 P(B <= j-1)`` for ``B ~ Binomial(n, 1/2)``, is at least ``confidence``; the
    whole range when ``n`` is too small for it. On these VMs a create's time spreads by
    several ms, so a median of 40 pairs can move by 2 to 3 ms from run to run: a figure
    smaller than its interval is not a measured difference."""
    xs = sorted(values)
    n = len(xs)
    if not n:
        raise ValueError("no values")
    j, below = 1, 1 / 2**n  # below: P(B <= j-1)
    while j < n - j + 1:
        wider = below + comb(n, j) / 2**n  # P(B <= j), if j+1 were taken
        if 1 - 2 * wider < confidence:
            break
        below, j = wider, j + 1
    return xs[j - 1], xs[n - j]
