"""What a speculative proposer is: given a sequence, guess its next tokens.

Proposers are registered by name and chosen by `--speculative-method`; the
verifier (verify.py) keeps the output distribution equal to the target
model's whatever a proposer guesses, so a proposer only affects speed.
"""

from collections.abc import Callable
from typing import Protocol


class Proposer(Protocol):
    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        """Up to max_tokens guesses for what follows token_ids (may be empty)."""
        ...


PROPOSERS: dict[str, Callable[[], Proposer]] = {}


def register(name: str):
    def wrap(factory):
        PROPOSERS[name] = factory
        return factory

    return wrap


def make_proposer(name: str) -> Proposer:
    if name not in PROPOSERS:
        raise ValueError(f"unknown speculative method {name!r}; known: {sorted(PROPOSERS)}")
    return PROPOSERS[name]()
