"""int4 weight-only quantization in plain torch: the format, and twin of kernels/quant_int4.py.

Asymmetric and group-wise along the input dimension, GGUF Q4_1's arithmetic:
each run of group_size weights in a row keeps a float32 scale and minimum, and
weight ~ q * scale + min with q in [0, 15]. The minimum makes a group that is
all positive (or all negative) use all sixteen levels.

Packing: two 4-bit values per uint8 along K; byte j of a row holds element 2j
in its low nibble and 2j + 1 in its high nibble. (GGUF pairs element j with
j + 16 inside its 32-element block instead, so a Q4_1 tensor is repacked, not
requantized, to load into this format with group_size 32.)
"""

import torch


def quantize_int4(
    weight: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [N, K] float -> (packed uint8 [N, K/2], scales, mins float32 [N, K/group_size])."""
    n, k = weight.shape
    if group_size % 2 or k % group_size:
        raise ValueError(f"group_size {group_size} must be even and divide K = {k}")
    groups = weight.float().view(n, k // group_size, group_size)
    low = groups.amin(dim=-1)
    scale = (groups.amax(dim=-1) - low) / 15
    # A constant group has zero range: it is stored exactly by its minimum alone.
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round((groups - low[..., None]) / safe[..., None]).clamp(0, 15).to(torch.uint8)
    q = q.view(n, k)
    return q[:, 0::2] | (q[:, 1::2] << 4), scale, low


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """packed uint8 [N, K/2] -> the 4-bit values as uint8 [N, K], in element order."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def dequantize_int4(
    packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, group_size: int
) -> torch.Tensor:
    """The float32 weight [N, K] that quantize_int4's output stands for."""
    q = unpack_int4(packed).float()
    scale = scales.float().repeat_interleave(group_size, dim=1)
    low = mins.float().repeat_interleave(group_size, dim=1)
    return q * scale + low


def int4_matmul_reference(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    group_size: int,
) -> torch.Tensor:
    """x [..., K] @ dequantized weight^T -> [..., N] in x's dtype, as nn.Linear would give."""
    return x @ dequantize_int4(packed, scales, mins, group_size).to(x.dtype).T
