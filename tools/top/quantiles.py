"""Histogram quantiles and windows, computed the way PromQL does."""

import math


def window(now: dict[float, float], before: dict[float, float] | None) -> dict[float, float]:
    """The observations made between two scrapes of one histogram's buckets.

    A restarted process starts its counters again; then everything it holds is new.
    """
    if not before:
        return now
    delta = {le: count - before.get(le, 0.0) for le, count in now.items()}
    return now if any(v < 0 for v in delta.values()) else delta


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """histogram_quantile(): linear inside the bucket the rank falls in; None with no data."""
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in ordered:
        if count >= rank:
            if math.isinf(upper):
                # Past the last finite bound nothing is known but that bound.
                return lower
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower
