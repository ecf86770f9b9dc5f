"""int8 weight-only quantization in plain torch: the format, and twin of kernels/quant_int8.py.

Symmetric, per output channel: row n of a Linear weight [out, in] is stored as
int8 values in [-127, 127] and one float32 scale, weight[n] ~ q[n] * scale[n].
-128 is left unused so that negation stays in range and zero is exact.
"""

import torch


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] float -> (q int8 [N, K], scale float32 [N])."""
    w = weight.float()
    scale = w.abs().amax(dim=1) / 127
    # An all-zero row would divide by zero; any scale stores its zeros exactly.
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / safe[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(q int8 [N, K], scale [N]) -> float32 weight [N, K]."""
    return q.float() * scale.float()[:, None]


def int8_matmul_reference(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ dequantized weight^T -> [..., N] in x's dtype, as nn.Linear would give."""
    return x @ dequantize_int8(q, scale).to(x.dtype).T
