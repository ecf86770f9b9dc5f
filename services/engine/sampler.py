"""Turn next-token logits into token ids, one request's settings per row."""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from services.engine.grammar.bitmask import apply_grammars
from services.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from services.engine.grammar.matcher import GrammarState

# Dividing by a tiny temperature overflows to inf (NaN after softmax); far above that
# the distribution is already one-hot, so such requests are treated as greedy.
_GREEDY_BELOW = 1e-5


class SamplingRequest(Protocol):
    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator
    grammar: "GrammarState | None"  # structured outputs: what the next token may be


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """Each request owns its random stream, so its samples do not depend on its batchmates."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


class Sampler:
    def __init__(self, eos_token_ids: Sequence[int]):
        self.eos_token_ids = list(eos_token_ids)

    def __call__(self, logits: torch.Tensor, requests: Sequence[SamplingRequest]) -> list[int]:
        """logits is [vocab] or [len(requests), vocab], for each request's next position."""
        rows = logits.float().reshape(len(requests), -1)
        rows = apply_grammars(rows, [request.grammar for request in requests])
        return [self._sample_one(row, request) for row, request in zip(rows, requests, strict=True)]

    def _sample_one(self, logits: torch.Tensor, request: SamplingRequest) -> int:
        probs, argmax = self.distribution(logits, request)
        if probs is None:
            return argmax
        return int(torch.multinomial(probs, 1, generator=request.generator))

    def distribution(
        self, logits: torch.Tensor, request: SamplingRequest
    ) -> tuple[torch.Tensor | None, int]:
        """(next-token probabilities, or None when greedy; the processed argmax).

        A grammar's mask is not applied here but by the caller, for the whole
        batch at once (__call__, or speculative verification for its drafts).
        """
        params = request.params
        logits = self._penalize(logits.float().clone(), request)
        banned = self._banned_ids(request)
        if banned:
            logits[banned] = float("-inf")
        argmax = int(logits.argmax())
        if params.temperature < _GREEDY_BELOW:
            return None, argmax
        logits = logits / params.temperature
        if params.top_k:
            kth_largest = logits.topk(min(params.top_k, logits.numel())).values[-1]
            logits[logits < kth_largest] = float("-inf")
        if params.top_p < 1:
            logits = _top_p(logits, params.top_p)
        probs = logits.softmax(-1)
        if params.min_p:
            probs[probs < params.min_p * probs.max()] = 0
            probs /= probs.sum()
        return probs, argmax

    def _penalize(self, logits: torch.Tensor, request: SamplingRequest) -> torch.Tensor:
        params = request.params
        if params.repetition_penalty != 1:
            # Hugging Face's rule over prompt and output: always push a seen token's logit down.
            seen = torch.tensor(
                sorted(set(request.prompt_ids) | set(request.output_ids)),
                dtype=torch.long,
                device=logits.device,
            )
            if seen.numel():
                scores = logits[seen]
                logits[seen] = torch.where(
                    scores > 0,
                    scores / params.repetition_penalty,
                    scores * params.repetition_penalty,
                )
        if (params.presence_penalty or params.frequency_penalty) and request.output_ids:
            # OpenAI's rule, over generated tokens only.
            output = torch.tensor(request.output_ids, dtype=torch.long, device=logits.device)
            ids, counts = output.unique(return_counts=True)
            logits[ids] -= params.presence_penalty + params.frequency_penalty * counts.float()
        return logits

    def _banned_ids(self, request: SamplingRequest) -> list[int]:
        params = request.params
        too_early = len(request.output_ids) < params.min_tokens
        banned = []
        # A grammar decides where its output ends: banning the end it requires
        # would leave no token to sample.
        if (too_early or params.ignore_eos) and request.grammar is None:
            banned += self.eos_token_ids
        if too_early:
            banned += params.stop_token_ids
        return banned


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    # Keep the fewest most likely tokens whose mass reaches top_p: a token goes
    # when those ranked above it already reach it, so the top token always stays.
    sorted_logits, order = logits.sort(descending=True)
    probs = sorted_logits.softmax(-1)
    mass_above = probs.cumsum(-1) - probs
    logits[order[mass_above >= top_p]] = float("-inf")
    return logits
