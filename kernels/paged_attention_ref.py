"""Decode attention over the paged KV pool in plain torch: twin of kernels/paged_attention.py.

Each sequence's blocks are gathered into one dense run of keys and values,
then a softmax masked to its context length weighs them; query head h reads
KV head h // (heads / kv_heads), the grouping the engine's attention uses.
"""

import torch


def paged_attention_decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """One new token per sequence attending over its whole context.

    q [seqs, heads, head_dim]; k_cache and v_cache one layer's pool,
    [blocks, block_size, kv_heads, head_dim]; block_tables [seqs, max_blocks],
    padded with any valid block id past a sequence's context; context_lens
    [seqs], each at least 1. scale defaults to 1/sqrt(head_dim).
    Returns [seqs, heads, head_dim] in q's dtype.
    """
    seqs, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    scale = head_dim**-0.5 if scale is None else scale
    # [seqs, positions, kv_heads, head_dim], positions = max_blocks * block_size.
    keys, values = (
        cache[block_tables.long()].flatten(1, 2).float() for cache in (k_cache, v_cache)
    )
    group = heads // kv_heads
    keys = keys.repeat_interleave(group, dim=2)
    values = values.repeat_interleave(group, dim=2)
    scores = torch.einsum("shd,sphd->shp", q.float(), keys) * scale
    positions = torch.arange(keys.shape[1], device=q.device)
    in_context = positions[None, :] < context_lens.to(q.device)[:, None]
    scores = scores.masked_fill(~in_context[:, None, :], float("-inf"))
    # Zero weight is not enough to silence a stale NaN in a slot past the context.
    values = values.masked_fill(~in_context[:, :, None, None], 0.0)
    return torch.einsum("shp,sphd->shd", scores.softmax(dim=-1), values).to(q.dtype)
