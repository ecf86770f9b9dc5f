"""Rotary position embedding of queries and keys in one Triton kernel.

The torch code rotates q and k with several elementwise kernels each (two
products, a concatenation, a sum); this reads q, k, cos and sin once and
writes the rotated q and k once. cos and sin come in as tensors, computed once
a step by rotary_cos_sin_reference and shared by every layer, rather than
in-kernel: the interpreter that tests this file cannot run libdevice's accurate
cos/sin, and the angles reach 1e5 radians, where a fast approximation is
wrong. Numerics follow rotary_ref.py, rounding where it rounds.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _round(x, dtype: tl.constexpr):
    """x rounded to dtype and widened back, as a torch op on dtype tensors would leave it."""
    return x.to(dtype).to(tl.float32)


@triton.jit
def _rotate_heads(
    src_ptr,
    dst_ptr,
    token,
    token_stride,
    head_stride,
    num_heads,
    cos_lo,
    cos_hi,
    sin_lo,
    sin_hi,
    HALF: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    dtype = dst_ptr.dtype.element_ty
    heads = tl.arange(0, BLOCK_HEADS)[:, None]
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < num_heads) & (dims < HALF)
    src = src_ptr + token * token_stride + heads * head_stride + dims
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    # x * cos + cat(-x2, x1) * sin, with each torch op's rounding to the model dtype.
    out1 = _round(x1 * cos_lo, dtype) - _round(x2 * sin_lo, dtype)
    out2 = _round(x2 * cos_hi, dtype) + _round(x1 * sin_hi, dtype)
    dst = dst_ptr + token * num_heads * 2 * HALF + heads * 2 * HALF + dims
    tl.store(dst, out1.to(dtype), mask=mask)
    tl.store(dst + HALF, out2.to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    k_out_ptr,
    q_token_stride,
    q_head_stride,
    k_token_stride,
    k_head_stride,
    table_token_stride,
    num_heads,
    num_kv_heads,
    HALF: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_KV_HEADS: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    # One program per token: its cos and sin are read once for all its query and key heads.
    token = tl.program_id(0)
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    mask = dims < HALF
    table = token * table_token_stride + dims
    cos_lo = tl.load(cos_ptr + table, mask=mask, other=0.0).to(tl.float32)
    cos_hi = tl.load(cos_ptr + table + HALF, mask=mask, other=0.0).to(tl.float32)
    sin_lo = tl.load(sin_ptr + table, mask=mask, other=0.0).to(tl.float32)
    sin_hi = tl.load(sin_ptr + table + HALF, mask=mask, other=0.0).to(tl.float32)
    _rotate_heads(
        q_ptr,
        q_out_ptr,
        token,
        q_token_stride,
        q_head_stride,
        num_heads,
        cos_lo,
        cos_hi,
        sin_lo,
        sin_hi,
        HALF,
        BLOCK_HEADS,
        BLOCK_HALF,
    )
    _rotate_heads(
        k_ptr,
        k_out_ptr,
        token,
        k_token_stride,
        k_head_stride,
        num_kv_heads,
        cos_lo,
        cos_hi,
        sin_lo,
        sin_hi,
        HALF,
        BLOCK_KV_HEADS,
        BLOCK_HALF,
    )


def rotary_embedding_triton(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton version of rotary_embedding_reference; new contiguous q and k.

    q [tokens, heads, head_dim] and k [tokens, kv_heads, head_dim] may be strided
    views (the engine's are slices of the fused qkv projection) as long as
    head_dim is contiguous; cos and sin are [tokens, 1, head_dim].
    """
    tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    cos, sin = cos.reshape(tokens, head_dim), sin.reshape(tokens, head_dim)
    if head_dim % 2:
        raise ValueError("rotary embedding needs an even head_dim")
    if {q.stride(-1), k.stride(-1), cos.stride(-1), sin.stride(-1)} != {1}:
        raise ValueError("q, k, cos and sin need a contiguous last dimension")
    if cos.stride(0) != sin.stride(0):
        raise ValueError("cos and sin must share a layout")
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    _rotary_kernel[(tokens,)](
        q,
        k,
        cos,
        sin,
        q_out,
        k_out,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos.stride(0),
        num_heads,
        num_kv_heads,
        HALF=head_dim // 2,
        BLOCK_HEADS=triton.next_power_of_2(num_heads),
        BLOCK_KV_HEADS=triton.next_power_of_2(num_kv_heads),
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
    )
    return q_out, k_out
