"""Decode attention over the paged KV pool in one Triton kernel.

The torch path gathers the decoding sequences' blocks into dense copies, a
group of similar lengths at a time, padded to the group's longest, before
attending. This kernel reads each sequence's keys and values in place, one KV
block at a time, through its block table, and keeps a running (online)
softmax so nothing of size context is ever materialised. Numerics: float32
throughout, one rounding at the end, as the twin in paged_attention_ref.py
computes.
"""

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_attention_decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    out_ptr,
    scale_log2,
    q_seq_stride,
    q_head_stride,
    cache_block_stride,
    cache_slot_stride,
    cache_head_stride,
    table_stride,
    out_seq_stride,
    head_dim,
    GROUP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_GROUP: tl.constexpr,
    BLOCK_SLOTS: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
):
    # One program per (sequence, KV head), serving the GROUP query heads that share
    # that KV head: each key and value is loaded once for all of them.
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    group = tl.arange(0, BLOCK_GROUP)
    heads = kv_head * GROUP + group
    dims = tl.arange(0, BLOCK_DIM)
    q_mask = (group < GROUP)[:, None] & (dims < head_dim)[None, :]
    q = tl.load(
        q_ptr + seq * q_seq_stride + heads[:, None] * q_head_stride + dims[None, :],
        mask=q_mask,
        other=0.0,
    ).to(tl.float32)
    context = tl.load(context_lens_ptr + seq)
    slots = tl.arange(0, BLOCK_SLOTS)
    # Running softmax state per query head: max score, sum of weights, weighted values.
    running_max = tl.full([BLOCK_GROUP], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_GROUP], tl.float32)
    acc = tl.zeros([BLOCK_GROUP, BLOCK_DIM], tl.float32)
    for logical in range(0, tl.cdiv(context, BLOCK_SIZE)):
        # int64: block * block stride passes 2**31 elements in a pool of a few GiB.
        block = tl.load(block_tables_ptr + seq * table_stride + logical).to(tl.int64)
        in_context = (slots < BLOCK_SIZE) & (logical * BLOCK_SIZE + slots < context)
        offsets = (
            block * cache_block_stride
            + slots[:, None] * cache_slot_stride
            + kv_head * cache_head_stride
            + dims[None, :]
        )
        # Slots past the context are never read: stale or never-written memory
        # there (NaN included) cannot reach the sum, whatever the mask weights.
        kv_mask = in_context[:, None] & (dims < head_dim)[None, :]
        k = tl.load(k_cache_ptr + offsets, mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + offsets, mask=kv_mask, other=0.0).to(tl.float32)
        # A decode step does GROUP multiply-adds per key element loaded: far too
        # few to feed tensor cores, so broadcast-and-sum on the CUDA cores, in
        # float32, and memory stays the bound.
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale_log2
        scores = tl.where(in_context[None, :], scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        # Scores carry log2(e) in the scale, so exp2 here is exp of the true scores.
        correction = tl.exp2(running_max - new_max)
        weights = tl.exp2(scores - new_max[:, None])
        running_sum = running_sum * correction + tl.sum(weights, axis=1)
        acc = acc * correction[:, None] + tl.sum(weights[:, :, None] * v[None, :, :], axis=1)
        running_max = new_max
    out = acc / running_sum[:, None]
    out_offsets = seq * out_seq_stride + heads[:, None] * head_dim + dims[None, :]
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_attention_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """The Triton version of paged_attention_decode_reference; a new contiguous tensor.

    block_tables and context_lens are int32 or int64 on q's device. k_cache and
    v_cache must share a layout with a contiguous head_dim.
    """
    seqs, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} KV heads evenly")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("k_cache and v_cache need one layout; head_dim must be contiguous")
    scale = head_dim**-0.5 if scale is None else scale
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    group = heads // kv_heads
    _paged_attention_decode_kernel[(seqs, kv_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        out,
        scale * math.log2(math.e),
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        head_dim,
        GROUP=group,
        BLOCK_SIZE=block_size,
        BLOCK_GROUP=triton.next_power_of_2(group),
        BLOCK_SLOTS=triton.next_power_of_2(block_size),
        BLOCK_DIM=triton.next_power_of_2(head_dim),
    )
    return out
