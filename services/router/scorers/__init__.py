"""Scorers: each rates every candidate in [0, 1], higher is better."""


def lower_is_better(values: list[float]) -> list[float]:
    """Min-max scaled so the lowest value scores 1 and the highest 0; all equal scores 1.

    Relative, not absolute: a scorer only ranks candidates, and policy weights,
    not the units of what was measured, decide how much that ranking counts.
    """
    low, high = min(values, default=0.0), max(values, default=0.0)
    if high == low:
        return [1.0] * len(values)
    return [(high - v) / (high - low) for v in values]
