"""Attention over the paged KV pool for a mixed batch of decodes and prefill chunks."""

from itertools import pairwise

import torch
import torch.nn.functional as F

from maas_kernels.ops import paged_attention_decode
from maas_services.engine import native_attention
from maas_services.engine.attention_metadata import AttentionMetadata, DecodeGroup


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    use_kernel: bool = False,
) -> torch.Tensor:
    """Store the new keys and values in the pool, then attend from the pool.

    q is [tokens, heads, head_dim]; k and v are [tokens, kv_heads, head_dim];
    k_cache and v_cache are one layer's pool, [blocks, block_size, kv_heads, head_dim].
    Returns [tokens, heads, head_dim].

    use_kernel is set where the model runs Triton (maas_kernels.ops.uses_triton): the
    decodes then run maas_kernels.paged_attention_decode, which reads each sequence's blocks in
    place through its block table instead of gathering them for SDPA. On a CPU with the
    native library (float32) they run services/engine/native_attention.py, which reads
    them in place too; elsewhere, the torch path below: grouped gathers and SDPA.
    Prefill chunks take SDPA either way.

    The pool may hold a narrower dtype than q (--kv-cache-dtype bf16 under a float32
    model): keys and values are rounded to it as they are stored and widened back to
    q's as they are read.
    """
    decodes = meta.num_decodes
    if not use_kernel and native_attention.handles(q, k_cache, v_cache):
        # One native call stores every new key and value and attends the decodes in
        # place; the metadata's decode groups are never built.
        out = native_attention.store_and_attend(q, k, v, k_cache, v_cache, meta)
        return out if decodes == q.shape[0] else _prefills(q, k_cache, v_cache, meta, out)
    kv_heads, head_dim = k_cache.shape[2:]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, meta.slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, meta.slot_mapping, v.to(v_cache.dtype))
    groups = meta.decode_groups
    if not use_kernel and decodes == q.shape[0] and len(groups) == 1 and groups[0].first == 0:
        # Every decode in one group, nothing else (any batch-1 decode step): its
        # output is the step's, with no copy into a batch-wide one.
        return _decode(q, k_cache, v_cache, groups[0])
    out = torch.empty_like(q)
    if decodes and use_kernel:
        # The kernel's pool layout is this layer's slice of PagedKVCache as it is,
        # and the padded block tables' filler (block 0) is a valid id it never reads.
        out[:decodes] = paged_attention_decode(
            q[:decodes], k_cache, v_cache, meta.block_tables[:decodes], meta.decode_context_lens
        )
    else:
        for group in groups:
            if group.first is None:
                queries = q.index_select(0, group.rows)
                out.index_copy_(0, group.rows, _decode(queries, k_cache, v_cache, group))
            else:
                rows = slice(group.first, group.first + group.rows.shape[0])
                out[rows] = _decode(q[rows], k_cache, v_cache, group)
    return _prefills(q, k_cache, v_cache, meta, out)


def _prefills(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    out: torch.Tensor,
) -> torch.Tensor:
    """out with each prefill chunk's rows attended by SDPA (their k, v already stored)."""
    bounds = pairwise(meta.query_start_loc[meta.num_decodes :])
    chunks = zip(bounds, meta.prefill_block_ids, meta.prefill_masks, strict=True)
    for (start, end), block_ids, mask in chunks:
        out[start:end] = _prefill(q[start:end], k_cache, v_cache, block_ids, mask)
    return out


def _gather(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """The listed blocks back to back, [len(block_ids) * block_size, kv_heads, head_dim]."""
    # Through the 2-D view [blocks, block_size * kv_heads * head_dim]: index_select
    # copies whole rows with memcpy there, 2-4x faster on CPU than on the 4-D pool.
    rows = cache.view(cache.shape[0], -1).index_select(0, block_ids)
    return rows.view(-1, *cache.shape[2:])


def _blocks(cache: torch.Tensor, group: DecodeGroup) -> torch.Tensor:
    """The group's blocks back to back: in place when they are one run in the pool."""
    if group.first_block is None:
        return _gather(cache, group.block_ids)
    return cache[group.first_block : group.first_block + group.block_ids.shape[0]]


def _decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, group: DecodeGroup
) -> torch.Tensor:
    """The group's decodes, [n, heads, head_dim], from their queries q [n, heads, head_dim]."""
    seqs, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    per_seq = group.block_ids.shape[0] // seqs * k_cache.shape[1] * kv_heads * head_dim
    # Each decode's gathered blocks as [seqs, kv_heads, positions, head_dim] in one
    # strided view (SDPA reads it without a copy) rather than three chained ones: at a
    # few tokens a layer's attention costs what its ops cost to call.
    shape = (seqs, kv_heads, group.positions, head_dim)
    strides = (per_seq, head_dim, kv_heads * head_dim, 1)
    keys, values = (
        _blocks(cache, group).as_strided(shape, strides).to(q.dtype) for cache in (k_cache, v_cache)
    )
    # The query heads that share a KV head become that head's rows of queries,
    # so grouped-query attention needs no copies of K and V per query head.
    grouped = q.view(seqs, kv_heads, heads // kv_heads, head_dim)
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=group.mask)
    return out.view(seqs, heads, head_dim)


def _prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_ids: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    context = mask.shape[1]
    keys = _gather(k_cache, block_ids)[:context].transpose(0, 1).to(q.dtype)
    values = _gather(v_cache, block_ids)[:context].transpose(0, 1).to(q.dtype)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        keys.unsqueeze(0),
        values.unsqueeze(0),
        attn_mask=mask,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)
