"""x @ W^T with W stored as int8 per-channel (quant_int8_ref.py's format), in one Triton kernel.

The weight is read as int8, a quarter of the bytes of float32 and half of
bfloat16, and dequantized in registers; no float copy of it ever exists in
memory. Decode steps, which are bound by reading weights, gain the most.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _int8_matmul_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    out_ptr,
    M,
    N,
    K,
    x_row_stride,
    w_row_stride,
    out_row_stride,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k_start in range(0, K, BLOCK_K):
        ks = k_start + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + rows[:, None] * x_row_stride + ks[None, :],
            mask=(rows < M)[:, None] & (ks < K)[None, :],
            other=0.0,
        )
        # [BLOCK_K, BLOCK_N]: the transposed tile of the [N, K] weight.
        w = tl.load(
            w_ptr + cols[None, :] * w_row_stride + ks[:, None],
            mask=(ks < K)[:, None] & (cols < N)[None, :],
            other=0,
        )
        # float32 operands: the interpreter cannot multiply bfloat16 (it would read
        # the bit patterns as integers), and on tensor cores float32 runs as TF32,
        # which holds bf16/fp16 activations and the integers of w exactly.
        acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc)
    # The scale is constant along K, so it multiplies each output once instead of
    # every weight: the sum over K stays a sum of exact integer-weighted terms.
    scale = tl.load(scale_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    acc = acc * scale[None, :]
    tl.store(
        out_ptr + rows[:, None] * out_row_stride + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=(rows < M)[:, None] & (cols < N)[None, :],
    )


def int8_matmul_triton(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The Triton version of int8_matmul_reference: x [..., K], q int8 [N, K], scale [N]."""
    n, k = q.shape
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("x and q need a contiguous last dimension")
    m = rows.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    # tl.dot needs at least 16 along every side; a decode batch is often smaller.
    block_m = min(64, max(16, triton.next_power_of_2(m)))
    block_n, block_k = 64, 64
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _int8_matmul_kernel[grid](
        rows,
        q,
        scale,
        out,
        m,
        n,
        k,
        rows.stride(0),
        q.stride(0),
        out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
    )
    return out.view(*x.shape[:-1], n)
