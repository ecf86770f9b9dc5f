"""SiLU-and-mul in one Triton kernel.

In torch, silu(gate) * up writes the activation to memory and reads it back
for the product; here each element of the gate/up projection is read once and
the product written once. Numerics follow activation_ref.py.
"""

import torch
import triton
import triton.language as tl

# Columns per program: a few elements per thread; wide MLPs get more programs, not wider ones.
_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, x_row_stride, intermediate, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < intermediate
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_row_stride + intermediate + cols, mask=mask, other=0.0)
    # torch rounds silu's result to the model dtype before the product; so does this.
    activated = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32)
    tl.store(
        out_ptr + row * intermediate + cols, (activated * up.to(tl.float32)).to(dtype), mask=mask
    )


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """The Triton version of silu_and_mul_reference; a new contiguous tensor."""
    if x.shape[-1] % 2:
        raise ValueError("x's last dimension must hold two equal halves, gate then up")
    intermediate = x.shape[-1] // 2
    rows = x.reshape(-1, 2 * intermediate)
    if rows.stride(-1) != 1:
        raise ValueError("x needs a contiguous last dimension")
    out = torch.empty(rows.shape[0], intermediate, dtype=x.dtype, device=x.device)
    block = min(_BLOCK, triton.next_power_of_2(intermediate))
    grid = (rows.shape[0], triton.cdiv(intermediate, block))
    _silu_and_mul_kernel[grid](rows, out, rows.stride(0), intermediate, BLOCK=block)
    return out.view(*x.shape[:-1], intermediate)
