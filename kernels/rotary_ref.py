"""Rotary position embedding in plain torch: the twin of kernels/rotary.py.

The engine's rotary on the CPU (services/engine/model.py calls these through
maas_kernels.ops, and builds cos and sin with rotary_cos_sin_reference on every
device): angles in float32, cos and sin rounded to the model
dtype once per step, half-split pairing (dimension i rotates with i + head_dim/2),
the Hugging Face layout.
"""

import torch


def rotary_cos_sin_reference(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each [tokens, 1, head_dim], for positions [tokens]; computed once a step."""
    # float32 angles whatever the model dtype: bfloat16 positions lose whole steps past 256.
    exponents = torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim
    angles = positions.float()[:, None] * (1.0 / theta**exponents)
    angles = torch.cat((angles, angles), dim=-1)[:, None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def rotary_embedding_reference(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [tokens, heads, head_dim] and k [tokens, kv_heads, head_dim].

    cos and sin as rotary_cos_sin_reference returns them.
    """
    return _rotate(q, cos, sin), _rotate(k, cos, sin)
