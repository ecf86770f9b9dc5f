"""What a speculative proposer is: given sequences, guess their next tokens.

Proposers are registered by name and chosen by `--speculative-method`; the
verifier (verify.py) keeps the output distribution equal to the target
model's whatever a proposer guesses, so a proposer only affects speed. It
must propose deterministically (the same input, the same guess): verify.py
treats a guess as a proposal distribution with all its mass on that token.
All of a step's sequences come in one call, so a model-based proposer can
batch them.
"""

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

import torch

from maas_services.engine.spec.config import SpecConfig


@dataclass
class DraftRequest:
    key: Hashable  # the sequence's id: stable across steps, for per-sequence state
    token_ids: list[int]  # prompt and output so far
    max_tokens: int


@dataclass
class TargetInfo:
    """What a proposer may need to know of the model it drafts for."""

    vocab_size: int
    max_model_len: int
    device: torch.device | str
    dtype: torch.dtype


class Proposer(Protocol):
    @classmethod
    def from_config(cls, config: SpecConfig, target: TargetInfo) -> "Proposer": ...

    def propose(self, requests: list[DraftRequest]) -> list[list[int]]:
        """Per request, up to max_tokens guesses for what follows (may be empty)."""
        ...


PROPOSERS: dict[str, type[Proposer]] = {}


def register(name: str):
    def wrap(cls):
        PROPOSERS[name] = cls
        return cls

    return wrap


def make_proposer(config: SpecConfig, target: TargetInfo) -> Proposer:
    if config.method not in PROPOSERS:
        raise ValueError(
            f"unknown speculative method {config.method!r}; known: {sorted(PROPOSERS)}"
        )
    return PROPOSERS[config.method].from_config(config, target)
