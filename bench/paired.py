"""Paired figures: rounds interleave the cases, so each round's pair shares the machine's
state of that moment; medians of per-pair ratios and differences cancel its drift."""

from __future__ import annotations

import statistics
from collections.abc import Iterable


def median_ratio(values: Iterable[float], base: Iterable[float]) -> float:
    """The median of each pair's ratio ``value / base``."""
    return statistics.median(v / b for v, b in zip(values, base, strict=True))


def median_added(values: Iterable[float], base: Iterable[float]) -> float:
    """The median of each pair's difference ``value - base``."""
    return statistics.median(v - b for v, b in zip(values, base, strict=True))
