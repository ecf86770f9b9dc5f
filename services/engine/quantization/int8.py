"""int8 weights, symmetric per output channel: kernels/quant_int8_ref.py's format."""

import torch

from maas_kernels.ops import int8_matmul
from maas_kernels.quant_int8_ref import quantize_int8
from maas_services.engine.quantization import cpu_kernel
from maas_services.engine.quantization.linear import QuantizedLinear

# Up to this many rows torch's CPU int8 kernel (a GEMV per row) wins; past it,
# dequantizing once and running the dense bf16 matmul (AMX/AVX512-BF16) does.
# Measured on SmolLM2's shapes on an AVX-512 EPYC: the kernel is ~1.5x faster
# than the bf16 matmul at 1 row, on par with dequantize + matmul at 16, and
# 1.3-2x slower than it from 32 rows up.
CPU_KERNEL_MAX_ROWS = 16
# torch's CPU kernel is vectorised for these only; in float32 it is 10-60x slower
# than a float32 matmul, so float32 runs cpu_kernel's instead.
CPU_KERNEL_DTYPES = (torch.bfloat16, torch.float16)


class Int8Linear(QuantizedLinear):
    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        shard_sizes: list[int] | None = None,
    ):
        out_features, in_features = weight.shape
        super().__init__(in_features, out_features, bias, dtype, shard_sizes)
        qweight, scale = quantize_int8(weight)
        self.register_buffer("qweight", qweight)
        # In the activation dtype: torch's CPU kernel requires it, the Triton kernel
        # widens it to float32 anyway, and a bf16 scale errs by at most 2^-9 of the
        # row, as a bf16 weight would.
        self.register_buffer("scale", scale.to(dtype))

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:
        if (
            rows.device.type == "cpu"
            and rows.dtype in CPU_KERNEL_DTYPES
            and rows.shape[0] <= CPU_KERNEL_MAX_ROWS
        ):
            return torch._weight_int8pack_mm(rows, self.qweight, self.scale)
        if cpu_kernel.handles(rows, self.in_features):
            return cpu_kernel.int8_matmul(rows, self.qweight, self.scale, self.int8_activations)
        # Triton on CUDA; elsewhere the twin: dequantize, then a dense matmul.
        return int8_matmul(rows, self.qweight, self.scale)
