"""When each request of an open-loop workload is sent, as seconds from the start.

Schedules are computed up front from a seed, so every policy or engine
variant in a run sees the same arrivals, and the progress bar knows the total.
"""

import random


def poisson(rate: float, count: int, rng: random.Random) -> list[float]:
    """A Poisson process of `rate` requests/s: exponential gaps of mean 1/rate.

    The first request goes at 0, as vLLM's benchmark sends it, so a short
    run doesn't start with an idle gap.
    """
    offsets, now = [], 0.0
    for _ in range(count):
        offsets.append(now)
        now += rng.expovariate(rate)
    return offsets


def periodic(every: float, until: float) -> list[float]:
    """Every `every` seconds, from `every` on, while before `until`."""
    offsets, now = [], every
    while now < until:
        offsets.append(now)
        now += every
    return offsets
