"""Speculative decoding inside continuous batching.

Before a step, each eligible running sequence gets up to k guessed tokens
appended (its draft); the step computes the last real token and the draft in
one pass, which costs about as much as one decode on a memory-bound model;
after it, verify.py keeps the longest acceptable prefix plus one more token.

Speculation is per request (SamplingParams.speculative) and adapts where it
pays less: each sequence drafts in proportion to its recent acceptance (a
moving average), pauses when that falls below min_acceptance (until it
recovers), and nothing is drafted when the batch is larger than max_batch
(decoding is then compute-bound, and drafts steal batch slots); n > 1 and
logprobs requests stay on the simple path.
"""

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from maas_services.engine.grammar.draft import constrain_draft
from maas_services.engine.sampler import Sampler
from maas_services.engine.sampling_params import SamplingParams
from maas_services.engine.sequence import Sequence
from maas_services.engine.spec.config import SpecConfig
from maas_services.engine.spec.proposer import DraftRequest, TargetInfo, make_proposer
from maas_services.engine.spec.verify import verify

if TYPE_CHECKING:
    from maas_services.engine.grammar.matcher import GrammarState

# How fast the acceptance average follows new evidence, and recovers when idle.
_EMA = 0.3
_RECOVERY = 0.02


@dataclass
class SamplingView:
    """What the sampler reads of a sequence, as of one drafted position."""

    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator
    grammar: "GrammarState | None"  # its masks are already in the logits verified


class SpeculativeDecoder:
    def __init__(self, config: SpecConfig, sampler: Sampler, target: TargetInfo):
        self.config = config
        self.sampler = sampler
        self.max_model_len = target.max_model_len
        self.proposer = make_proposer(config, target) if config.method else None

    def propose(self, running: list[Sequence]) -> float | None:
        """Append drafts to the eligible; the proposer's seconds, None if it did not run."""
        if self.proposer is None or len(running) > self.config.max_batch:
            return None
        seqs = [seq for seq in running if self._eligible(seq)]
        if not seqs:
            return None
        requests = [DraftRequest(seq.seq_id, seq.token_ids, self._budget(seq)) for seq in seqs]
        started = time.perf_counter()
        drafts = self.proposer.propose(requests)
        seconds = time.perf_counter() - started
        for seq, draft in zip(seqs, drafts, strict=True):
            if draft:
                seq.token_ids.extend(draft)
                seq.num_draft_tokens = len(draft)
        return seconds

    def _budget(self, seq: Sequence) -> int:
        # Fewer guesses where fewer are accepted: a rejected guess is wasted compute.
        adapted = max(1, math.ceil(self.config.num_tokens * seq.draft_acceptance))
        return min(
            adapted,
            seq.params.max_tokens - len(seq.output_ids) - 1,
            self.max_model_len - seq.num_tokens - 1,
        )

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
        drafted = len(draft)
        seq.drop_drafts()
        before = seq.output_ids
        if seq.grammar is not None:
            draft, logits = constrain_draft(seq.grammar, draft, logits)

        def target(j: int):
            view = SamplingView(
                seq.params, seq.prompt_ids, before + draft[:j], seq.generator, seq.grammar
            )
            return self.sampler.distribution(logits[j], view)

        accepted, token = verify(draft, target, seq.generator)
        seq.draft_acceptance += _EMA * (accepted / drafted - seq.draft_acceptance)
        return [*draft[:accepted], token]
