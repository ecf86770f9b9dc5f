"""Log-probabilities of sampled tokens, from the model's raw distribution.

Like OpenAI and vLLM, these describe the model's distribution before
temperature, top-p or penalties, so they are comparable across requests.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # TokenLogprob crosses to the serving process, which imports no torch
    import torch


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


def token_logprob(logits: "torch.Tensor", token_id: int, top_n: int) -> TokenLogprob:
    logprobs = logits.float().log_softmax(-1)
    top: list[tuple[int, float]] = []
    if top_n > 0:
        values, ids = logprobs.topk(top_n)
        top = list(zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprob(token_id, float(logprobs[token_id]), top)
