"""SiLU-and-mul in plain torch: the twin of kernels/activation.py.

The gated activation of a Llama MLP as the engine computes it: the fused
gate/up projection's output split in halves, silu(gate) * up.
"""

import torch
import torch.nn.functional as F


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2 * intermediate], gate half first -> [..., intermediate]."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
