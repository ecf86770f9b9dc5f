"""Wide float32 matmuls on the CPU: the LM head (SmolLM2: 49,152 rows).

Above cpu_kernel.MAX_ROW_KERNEL_ROWS rows (decode batches, prefill's last
rows) it runs native/matmul.cpp's panel GEMM (native/linear.cpp), as the
layer halves do: whole decode steps at 32 and 64 streams cost 8% and 4% less
CPU with it (docs/engine.md, "64 streams on the native step"); its sums are
in another order, within float32 rounding of F.linear. Elsewhere (a few rows,
no library, a tracked backward) it runs in slices of its weight's rows:
MKL's float32 GEMM ran 32 decode rows in 94 ms whole against 60 ms in slices
of 768 rows (benchmarks/results/step_slices_ab.json); each output element is
the same dot product either way, so the slices are bit-identical to one
F.linear (tests/unit/engine/test_cpu_linear.py).
"""

import torch
import torch.nn.functional as F

from maas_kernels.native import bindings
from maas_services.engine.quantization import cpu_kernel

# Weights up to this many rows run whole; wider ones in slices of SLICE_ROWS.
WHOLE_UP_TO = 1536
SLICE_ROWS = 768


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for a 2-D x: natively for many rows, else in row slices."""
    if _native(x, weight, bias):
        return _native_linear(x, weight, bias)
    return sliced(x, weight, bias)


def sliced(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), in row slices of a wide weight on the CPU."""
    if x.device.type != "cpu" or weight.shape[0] <= WHOLE_UP_TO:
        return F.linear(x, weight, bias)
    weights = weight.split(SLICE_ROWS)
    biases = [None] * len(weights) if bias is None else bias.split(SLICE_ROWS)
    return torch.cat([F.linear(x, w, b) for w, b in zip(weights, biases, strict=True)], -1)


def _native(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    # The native call has no backward: a draft model's training keeps torch's.
    tracked = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    return (
        not tracked
        and x.dim() == 2
        and x.shape[0] > cpu_kernel.MAX_ROW_KERNEL_ROWS
        and weight.shape[0] > WHOLE_UP_TO
        and weight.dtype == torch.float32
        and weight.is_contiguous()
        and (bias is None or bias.is_contiguous())
        and cpu_kernel.handles(x, weight.shape[1])
        and bindings.library() is not None
    )


def _native_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    x = x.contiguous()
    n, k = weight.shape
    out = torch.empty(x.shape[0], n)
    bindings.library().f32_linear(
        x.data_ptr(),
        x.shape[0],
        x.stride(0),
        weight.data_ptr(),
        None if bias is None else bias.data_ptr(),
        n,
        k,
        out.data_ptr(),
        cpu_kernel.MAX_ROW_KERNEL_ROWS,
        cpu_kernel.PANEL_BYTES,
        torch.get_num_threads(),
    )
    return out
