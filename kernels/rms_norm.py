"""Residual add + RMSNorm fused in one Triton kernel.

A decoder layer adds each sublayer's output to the residual stream and
normalises the sum for the next sublayer. Apart, that is an add kernel and a
norm kernel, each reading and writing [tokens, hidden]; fused, every input is
read once and each output written once. Numerics follow rms_norm_ref.py:
the kernel rounds to the model dtype at the same points the torch code does.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_residual_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    new_residual_ptr,
    x_row_stride,
    residual_row_stride,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One program per token: a whole row fits in registers for any Llama hidden size.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    dtype = out_ptr.dtype.element_ty
    # Arithmetic in float32 always: it is what the torch ops do inside, and the
    # Triton interpreter cannot do arithmetic on bfloat16 values at all.
    h = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * residual_row_stride + cols, mask=mask, other=0.0)
        h = (h + r.to(tl.float32)).to(dtype)
        tl.store(new_residual_ptr + row * hidden + cols, h, mask=mask)
        h = h.to(tl.float32)
    variance = tl.sum(h * h, axis=0) / hidden
    normed = (h * tl.rsqrt(variance + eps)).to(dtype).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * hidden + cols, (w * normed).to(dtype), mask=mask)


def rms_norm_residual_triton(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton version of rms_norm_residual_reference; weight in x's dtype.

    Returns new contiguous tensors, except that new_residual is x itself when
    residual is None.
    """
    hidden = x.shape[-1]
    rows = x.reshape(-1, hidden)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    # Without a residual, the kernel neither reads one nor writes a sum: x stands
    # in for both pointers.
    res_rows = rows if residual is None else residual.reshape(-1, hidden)
    new_residual = rows if residual is None else torch.empty_like(out)
    if rows.stride(-1) != 1 or res_rows.stride(-1) != 1:
        raise ValueError("x and residual need a contiguous last dimension")
    block = triton.next_power_of_2(hidden)
    _rms_norm_residual_kernel[(rows.shape[0],)](
        rows,
        res_rows,
        weight,
        out,
        new_residual,
        rows.stride(0),
        res_rows.stride(0),
        hidden,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        # About 8 to 16 elements per thread: wide rows get more warps.
        num_warps=min(max(block // 256, 1), 8),
    )
    return out.view(x.shape), x if residual is None else new_residual.view(x.shape)
