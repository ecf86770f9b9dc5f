"""Residual add + RMSNorm in plain torch: the twin of kernels/rms_norm.py.

This is the engine's RMSNorm (services/engine/model.py) with the residual add
that precedes it in a decoder layer, so the CPU path and the Triton kernel are
checked against the same arithmetic.
"""

import torch


def rms_norm_residual_reference(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(normed, new_residual) for x [..., hidden]; new_residual = x + residual.

    With residual None there is nothing to add (the first layer): new_residual is x.
    The sum is rounded to x's dtype, as the engine's `x + sublayer(x)` is, then
    normalised in float32 and cast back before the weight scales it.
    """
    if residual is not None:
        x = x + residual
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype), x
