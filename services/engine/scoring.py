"""Logits at every position of a text in one prefill, as the engine computes them.

What the engine's start-up known-answer check scores (known_answer.py) and
what `maas eval perplexity` (tools/eval) measures: one forward over a fresh
paged KV pool, the layers run by the serving engine's own compute path.
"""

import torch

from maas_services.common.block_hash import BLOCK_SIZE
from maas_services.engine.attention_metadata import AttentionMetadata
from maas_services.engine.compute_path import EAGER, ComputePath
from maas_services.engine.kv_cache import PagedKVCache
from maas_services.engine.model import LlamaForCausalLM


def window_logits(
    model: LlamaForCausalLM,
    token_ids: list[int],
    device: torch.device | str,
    path: ComputePath = EAGER,
    kv_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Logits at every position of one sequence, prefilled in one step over a fresh pool
    (of kv_dtype, else the model's: a serving engine's own pool dtype), its layers and head
    run by `path` (a serving engine's own: known_answer.py)."""
    dtype = kv_dtype or model.dtype
    blocks = -(-len(token_ids) // BLOCK_SIZE)
    pool = PagedKVCache.allocate(model.config, blocks, BLOCK_SIZE, dtype, device)
    positions = torch.arange(len(token_ids))
    meta = AttentionMetadata.build(
        positions, [len(token_ids)], [len(token_ids)], [list(range(blocks))], BLOCK_SIZE, device
    )
    ids = torch.tensor(token_ids, device=device)
    return path.logits(model, model(ids, positions.to(device), pool, meta, path))
