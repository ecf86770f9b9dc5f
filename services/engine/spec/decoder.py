"""Speculative decoding inside continuous batching.

Before a step, each eligible running sequence gets up to k guessed tokens
appended (its draft); the step computes the last real token and the draft in
one pass, which costs about as much as one decode on a memory-bound model;
after it, verify.py keeps the longest acceptable prefix plus one more token.

Speculation is per request (SamplingParams.speculative) and switches itself
off where it does not pay: when the batch is larger than max_batch (decoding
is then compute-bound, and drafts steal batch slots), for a sequence whose
recent drafts are mostly rejected (until its moving average recovers), and
for n > 1 or logprobs requests (kept on the simple path).
"""

import time
from dataclasses import dataclass

import torch

from services.engine import metrics
from services.engine.sampler import Sampler
from services.engine.sampling_params import SamplingParams
from services.engine.sequence import Sequence
from services.engine.spec.proposer import make_proposer
from services.engine.spec.verify import verify

# How fast the acceptance average follows new evidence, and recovers when idle.
_EMA = 0.3
_RECOVERY = 0.02


@dataclass
class SpecConfig:
    method: str = ""  # empty: off
    num_tokens: int = 4
    max_batch: int = 8
    min_acceptance: float = 0.3


@dataclass
class SamplingView:
    """What the sampler reads of a sequence, as of one drafted position."""

    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator


class SpeculativeDecoder:
    def __init__(self, config: SpecConfig, sampler: Sampler, max_model_len: int):
        self.config = config
        self.sampler = sampler
        self.max_model_len = max_model_len
        self.proposer = make_proposer(config.method) if config.method else None

    def propose(self, running: list[Sequence]) -> None:
        if self.proposer is None or len(running) > self.config.max_batch:
            return
        for seq in running:
            if not self._eligible(seq):
                continue
            budget = min(
                self.config.num_tokens,
                seq.params.max_tokens - len(seq.output_ids) - 1,
                self.max_model_len - seq.num_tokens - 1,
            )
            started = time.perf_counter()
            draft = self.proposer.propose(seq.token_ids, budget)
            metrics.SPEC_PROPOSER_SECONDS.observe(time.perf_counter() - started)
            if draft:
                seq.token_ids.extend(draft)
                seq.num_draft_tokens = len(draft)

    def _eligible(self, seq: Sequence) -> bool:
        params = seq.params
        if not params.speculative or params.n > 1 or params.logprobs:
            return False
        if seq.num_uncomputed_tokens != 1 or not seq.output_ids:
            return False  # still in prefill
        if seq.draft_acceptance < self.config.min_acceptance:
            seq.draft_acceptance += _RECOVERY
            return False
        return True

    def accept(self, seq: Sequence, logits: torch.Tensor) -> list[int]:
        """Verify seq's draft against logits [1 + draft, vocab]; return the new tokens.

        The draft is removed from token_ids; the caller appends the returned tokens.
        """
        draft = seq.token_ids[-seq.num_draft_tokens :]
        seq.drop_drafts()
        before = seq.output_ids

        def target(j: int):
            view = SamplingView(seq.params, seq.prompt_ids, before + draft[:j], seq.generator)
            return self.sampler.distribution(logits[j], view)

        accepted, token = verify(draft, target, seq.generator)
        seq.draft_acceptance += _EMA * (accepted / len(draft) - seq.draft_acceptance)
        metrics.SPEC_DRAFT_TOKENS.inc(len(draft))
        metrics.SPEC_ACCEPTED_TOKENS.inc(accepted)
        metrics.SPEC_ACCEPTED_LENGTH.observe(accepted)
        return [*draft[:accepted], token]
