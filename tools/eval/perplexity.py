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

from maas_services.common.block_hash import BLOCK_SIZE
from maas_services.engine.attention_metadata import AttentionMetadata
from maas_services.engine.compute_path import EAGER, ComputePath
from maas_services.engine.kv_cache import PagedKVCache
from maas_services.engine.model import LlamaForCausalLM

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


def window_logits(
    model: LlamaForCausalLM,
    token_ids: list[int],
    device: torch.device | str,
    path: ComputePath = EAGER,
) -> torch.Tensor:
    """Logits at every position of one sequence, prefilled in one step over a fresh pool,
    its layers run by `path` (a serving engine's own: known_answer.py)."""
    dtype = model.model.embed_tokens.weight.dtype
    blocks = -(-len(token_ids) // BLOCK_SIZE)
    pool = PagedKVCache.allocate(model.config, blocks, BLOCK_SIZE, dtype, device)
    positions = torch.arange(len(token_ids))
    meta = AttentionMetadata.build(
        positions, [len(token_ids)], [len(token_ids)], [list(range(blocks))], BLOCK_SIZE, device
    )
    ids = torch.tensor(token_ids, device=device)
    return model.compute_logits(model(ids, positions.to(device), pool, meta, path))
