"""Wide float32 matmuls on the CPU, run as slices of their weight's rows.

The LM head is the widest (SmolLM2: 49,152 rows). On the AVX2 EPYC, one
thread, MKL's float32 GEMM runs it at 32 decode rows in 94 ms whole against
60 ms in slices of 768 rows; a whole decode step at 8-64 streams costs
3-13% less CPU with the head sliced (benchmarks/results/step_slices_ab.json).
gate_up (3,072 rows) is faster sliced alone but not within a step, where its
weight comes from memory either way: it stays whole. Each output element is
the same dot product either way, so the slices' results are bit-identical to
one F.linear (tests/unit/engine/test_cpu_linear.py).
"""

import torch
import torch.nn.functional as F

# Weights up to this many rows run whole; wider ones in slices of SLICE_ROWS.
WHOLE_UP_TO = 1536
SLICE_ROWS = 768


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), in row slices of a wide weight on the CPU."""
    if x.device.type != "cpu" or weight.shape[0] <= WHOLE_UP_TO:
        return F.linear(x, weight, bias)
    weights = weight.split(SLICE_ROWS)
    biases = [None] * len(weights) if bias is None else bias.split(SLICE_ROWS)
    return torch.cat([F.linear(x, w, b) for w, b in zip(weights, biases, strict=True)], -1)
