"""Speculative decoding pieces: the n-gram proposer and exact verification."""

import torch

from maas_services.engine.spec.ngram import NgramProposer
from maas_services.engine.spec.verify import verify


def test_ngram_proposes_what_followed_the_latest_match():
    proposer = NgramProposer(min_n=2, max_n=3)
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    # The suffix 1 2 3 last appeared before 7 8 5.
    assert proposer.lookup(tokens, 3) == [7, 8, 5]
    assert proposer.lookup(tokens, 1) == [7]
    assert proposer.lookup([4, 5, 6, 7], 3) == []
    assert proposer.lookup(tokens, 0) == []


def greedy_target(argmaxes):
    return lambda j: (None, argmaxes[j])


def test_greedy_verification_accepts_exactly_the_argmax_prefix():
    g = torch.Generator().manual_seed(0)
    assert verify([5, 6, 7], greedy_target([5, 6, 1, 4]), g) == (2, 1)
    assert verify([5, 6], greedy_target([5, 6, 9]), g) == (2, 9)
    assert verify([5], greedy_target([3, 0]), g) == (0, 3)


def test_sampled_verification_keeps_the_target_distribution():
    """Whatever the draft, the first emitted token is distributed as p (chi-square)."""
    g = torch.Generator().manual_seed(1)
    p0 = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    p1 = torch.tensor([0.1, 0.1, 0.6, 0.1, 0.1])
    counts = torch.zeros(5)
    trials = 20_000
    for _ in range(trials):
        # A draft that is often wrong: token 3 first (p0 = 0.1), then token 2.
        accepted, token = verify([3, 2], lambda j: ((p0, p1, p1)[j], 0), g)
        first = 3 if accepted >= 1 else token
        counts[first] += 1
    expected = p0 * trials
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    # The 0.999 quantile of chi-square with 4 degrees of freedom.
    assert chi_square < 18.47, (counts, expected)
