"""int8 weights, symmetric: per output channel (kernels/quant_int8_ref.py's format), or per
group of inputs as a GGUF file's Q8_0 blocks store them (gguf_blocks.read_int8_head)."""

from dataclasses import dataclass

import torch

from maas_kernels.ops import int8_matmul
from maas_kernels.quant_int8_ref import dequantize_int8, quantize_int8
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


@dataclass
class Int8Weight:
    """weight = q * scale: q int8 [N, K] in -127..127; scale float32 [N] (group_size 0, a
    scale per row) or [N, K / group_size] (a scale per group of inputs)."""

    q: torch.Tensor
    scale: torch.Tensor
    group_size: int = 0

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> "Int8Weight":
        return cls(*quantize_int8(weight))

    def dequantize(self) -> torch.Tensor:
        if not self.group_size:
            return dequantize_int8(self.q, self.scale)
        return self.q.float() * self.scale.float().repeat_interleave(self.group_size, dim=1)


class Int8Linear(QuantizedLinear):
    def __init__(
        self,
        weight: torch.Tensor | Int8Weight,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        shard_sizes: list[int] | None = None,
    ):
        """weight: a float weight, quantized per row here, or int8 values as they are."""
        if not isinstance(weight, Int8Weight):
            weight = Int8Weight.quantize(weight)
        out_features, in_features = weight.q.shape
        super().__init__(in_features, out_features, bias, dtype, shard_sizes)
        self.register_buffer("qweight", weight.q)
        self.group_size = weight.group_size
        # A scale per row in the activation dtype: torch's CPU kernel requires it, the
        # Triton kernel widens it to float32 anyway, and a bf16 scale errs by at most 2^-9
        # of the row, as a bf16 weight would. Group scales stay float32, as the file's
        # float16 ones widen exactly, for the CPU's float32 kernels that run them.
        self.register_buffer("scale", weight.scale if self.group_size else weight.scale.to(dtype))

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:
        if (
            not self.group_size
            and rows.device.type == "cpu"
            and rows.dtype in CPU_KERNEL_DTYPES
            and rows.shape[0] <= CPU_KERNEL_MAX_ROWS
        ):
            return torch._weight_int8pack_mm(rows, self.qweight, self.scale)
        if cpu_kernel.handles(rows, self.in_features):
            return cpu_kernel.int8_matmul(
                rows, self.qweight, self.scale, self.group_size, self.int8_activations
            )
        if self.group_size:
            # No other kernel takes group scales: the exact weights, then a dense matmul.
            weight = Int8Weight(self.qweight, self.scale, self.group_size).dequantize()
            return rows @ weight.to(rows.dtype).T
        # Triton on CUDA; elsewhere the twin: dequantize, then a dense matmul.
        return int8_matmul(rows, self.qweight, self.scale)
