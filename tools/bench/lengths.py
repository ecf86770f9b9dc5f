"""Random prompt and output lengths for chat-like workloads, within a range.

Real chat lengths are skewed: most turns are short, a few are long. The
lognormal draw is centred on the range's geometric mean with the range's
ends two standard deviations out (about 95% fall inside; the rest are
clipped). `uniform` spreads them evenly instead.
"""

import math
import random

DISTRIBUTIONS = ("lognormal", "uniform")


def draw(rng: random.Random, low: int, high: int, distribution: str = "lognormal") -> int:
    if high <= low:
        return low
    if distribution == "uniform":
        return rng.randint(low, high)
    median = math.sqrt(low * high)
    sigma = math.log(high / low) / 4
    return min(high, max(low, round(rng.lognormvariate(math.log(median), sigma))))
