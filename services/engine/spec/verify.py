"""Verification of draft tokens that keeps the target model's distribution.

For each draft token d with proposal probability q(d) (a deterministic
proposer puts all its mass on d, so q(d) = 1), accept with probability
min(1, p(d) / q(d)); on the first rejection, sample from the residual
max(0, p - q) renormalised, which for a one-hot q is p without d. If every
draft is accepted, one bonus token comes from the distribution after the last
draft. The result is distributed exactly as sampling from p one token at a
time (Leviathan et al., 2023). Greedy requests accept a draft only when it is
the target's argmax, so they produce exactly the non-speculative tokens.
"""

from collections.abc import Callable

import torch

from maas_services.engine.sampler import draw

# One position's target: None for greedy (then `argmax` decides), else probabilities.
Target = Callable[[int], tuple[torch.Tensor | None, int]]


def verify(drafts: list[int], target: Target, generator: torch.Generator) -> tuple[int, int]:
    """Return (accepted draft count, the token after them).

    target(j) gives position j's (probs or None, argmax) given drafts[:j].
    """
    for j, draft in enumerate(drafts):
        probs, argmax = target(j)
        if probs is None:
            if draft != argmax:
                return j, argmax
            continue
        accept = torch.rand((), generator=generator, device=probs.device) < probs[draft]
        if not bool(accept):
            # Rejection means p(draft) < 1, so the residual has mass.
            residual = probs.clone()
            residual[draft] = 0
            return j, draw(residual, generator)
    probs, argmax = target(len(drafts))
    if probs is None:
        return len(drafts), argmax
    return len(drafts), draw(probs, generator)
