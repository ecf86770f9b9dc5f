"""Perplexity of the engine's model (its own forward over the paged KV pool) on a text.

The text is cut into consecutive windows of `window` tokens and each window
is scored on its own: every token after the first is predicted from the ones
before it in the window. Windows that do not overlap cost one forward per
token, where a sliding window would cost window/stride of them; the gate
compares two models on the same windows, for which that is enough.
"""

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from maas_services.engine.model import LlamaForCausalLM
from maas_services.engine.scoring import window_logits

DEFAULT_TEXT = Path(__file__).parent / "data" / "pride_and_prejudice_ch1-3.txt"


@dataclass
class PerplexityResult:
    perplexity: float
    mean_nll: float  # nats per scored token
    tokens: int  # tokens scored (each window's first token is context only)
    seconds: float


@torch.inference_mode()
def perplexity(
    model: LlamaForCausalLM, token_ids: list[int], window: int, device: torch.device | str = "cpu"
) -> PerplexityResult:
    if window < 2:
        raise ValueError("a window needs at least two tokens: one to read, one to predict")
    started = time.perf_counter()
    total_nll, scored = 0.0, 0
    for start in range(0, len(token_ids), window):
        chunk = token_ids[start : start + window]
        if len(chunk) < 2:
            break
        logits = window_logits(model, chunk, device)
        targets = torch.tensor(chunk[1:], device=device)
        total_nll += F.cross_entropy(logits[:-1].float(), targets, reduction="sum").item()
        scored += len(chunk) - 1
    if not scored:
        raise ValueError("the text has fewer than two tokens")
    mean = total_nll / scored
    return PerplexityResult(math.exp(mean), mean, scored, time.perf_counter() - started)
