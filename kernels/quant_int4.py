"""x @ W^T with W stored as packed int4 groups (quant_int4_ref.py's format), in one Triton kernel.

The weight is read as packed nibbles plus a scale and minimum per group, an
eighth of float32's bytes and a quarter of bfloat16's, and dequantized in
registers; decode steps, bound by reading weights, gain the most.
"""

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _int4_matmul_kernel(
    x_ptr,
    packed_ptr,
    scales_ptr,
    mins_ptr,
    out_ptr,
    M,
    N,
    K,
    x_row_stride,
    packed_row_stride,
    group_row_stride,
    out_row_stride,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < M
    col_mask = cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    # BLOCK_K divides GROUP_SIZE, which divides K: every tile is whole and lies
    # inside one group, so each column needs one scale and one minimum per tile.
    for k_start in range(0, K, BLOCK_K):
        ks = k_start + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + rows[:, None] * x_row_stride + ks[None, :],
            mask=row_mask[:, None],
            other=0.0,
        )
        # [BLOCK_K, BLOCK_N], transposed from the [N, K/2] bytes: each byte is loaded
        # for both of its elements (the second load hits cache) and shifted to its nibble.
        packed = tl.load(
            packed_ptr + cols[None, :] * packed_row_stride + (ks // 2)[:, None],
            mask=col_mask[None, :],
            other=0,
        ).to(tl.int32)
        q = (packed >> ((ks % 2) * 4)[:, None]) & 0xF
        group = cols * group_row_stride + k_start // GROUP_SIZE
        scale = tl.load(scales_ptr + group, mask=col_mask, other=0.0).to(tl.float32)
        low = tl.load(mins_ptr + group, mask=col_mask, other=0.0).to(tl.float32)
        w = q.to(tl.float32) * scale[None, :] + low[None, :]
        # float32 operands: the interpreter cannot multiply bfloat16 (it would read
        # the bit patterns as integers), and on tensor cores float32 runs as TF32,
        # which holds bf16/fp16 activations exactly.
        acc = tl.dot(x.to(tl.float32), w, acc)
    tl.store(
        out_ptr + rows[:, None] * out_row_stride + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=row_mask[:, None] & col_mask[None, :],
    )


def int4_matmul_triton(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    group_size: int,
) -> torch.Tensor:
    """The Triton version of int4_matmul_reference; group_size a multiple of 16.

    x [..., K]; packed uint8 [N, K/2]; scales and mins [N, K/group_size], one layout.
    """
    n, k = packed.shape[0], packed.shape[1] * 2
    if group_size % 16 or k % group_size:
        raise ValueError(f"group_size {group_size} must be a multiple of 16 dividing K = {k}")
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1 or packed.stride(-1) != 1:
        raise ValueError("x and packed need a contiguous last dimension")
    if scales.stride() != mins.stride() or scales.stride(-1) != 1:
        raise ValueError("scales and mins need one layout with contiguous groups")
    m = rows.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    # tl.dot needs at least 16 along every side; a decode batch is often smaller.
    block_m = min(64, max(16, triton.next_power_of_2(m)))
    block_n = 64
    # The largest power of two up to 64 that divides the group (16 at least, as checked).
    block_k = math.gcd(group_size, 64)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _int4_matmul_kernel[grid](
        rows,
        packed,
        scales,
        mins,
        out,
        m,
        n,
        k,
        rows.stride(0),
        packed.stride(0),
        scales.stride(0),
        out.stride(0),
        GROUP_SIZE=group_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
    )
    return out.view(*x.shape[:-1], n)
