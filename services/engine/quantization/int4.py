"""int4 weights, asymmetric per group of inputs: kernels/quant_int4_ref.py's format.

Int4Weight is that format, the one thing every source produces (quantizing a
float weight, or repacking a GGUF file's 4-bit blocks). Two modules run it:
CpuInt4Linear converts it to the layout of torch's CPU int4 kernel, for
bf16/fp16 on the CPU; Int4Linear keeps it as it is for cpu_kernel's AVX2
matmul (float32 on the CPU) and maas_kernels.int4_matmul (the Triton kernel on
CUDA, dequantize + matmul where neither runs).
"""

from dataclasses import dataclass

import torch

from maas_kernels.ops import int4_matmul
from maas_kernels.quant_int4_ref import quantize_int4, unpack_int4
from maas_services.engine.quantization import cpu_kernel
from maas_services.engine.quantization.config import GROUP_SIZES
from maas_services.engine.quantization.linear import QuantizedLinear

# torch's CPU kernel is vectorised for these (in float32 it is 20-100x slower than
# a float32 matmul), and lays the weight out in tiles of 16 output rows at least.
CPU_KERNEL_DTYPES = (torch.bfloat16, torch.float16)
CPU_KERNEL_ROW_MULTIPLE = 16


@dataclass
class Int4Weight:
    packed: torch.Tensor  # uint8 [N, K/2]: element 2j in byte j's low nibble, 2j+1 in its high
    scales: torch.Tensor  # float32 [N, K/group_size]
    mins: torch.Tensor  # float32 [N, K/group_size]; weight = level * scale + min, level 0..15
    group_size: int

    @classmethod
    def quantize(cls, weight: torch.Tensor, group_size: int) -> "Int4Weight":
        return cls(*quantize_int4(weight, group_size), group_size)

    @classmethod
    def cat(cls, parts: list["Int4Weight"]) -> "Int4Weight":
        """Stack row-wise, as a fused projection stacks its shards."""
        if len({p.group_size for p in parts}) != 1:
            raise ValueError("cannot fuse int4 weights with different group sizes")
        return cls(
            torch.cat([p.packed for p in parts]),
            torch.cat([p.scales for p in parts]),
            torch.cat([p.mins for p in parts]),
            parts[0].group_size,
        )

    def to(self, device: torch.device | str) -> "Int4Weight":
        return Int4Weight(
            self.packed.to(device), self.scales.to(device), self.mins.to(device), self.group_size
        )

    @property
    def shape(self) -> tuple[int, int]:
        return self.packed.shape[0], self.packed.shape[1] * 2


def int4_group_size(in_features: int, requested: int) -> int:
    """The requested group size if it divides the row, else the largest smaller one that does.

    SmolLM2's 576 inputs take 64, not 128: a group may not straddle two rows'
    worth of scales, and padding every row to 640 would cost the memory saved.
    """
    for size in sorted(GROUP_SIZES, reverse=True):
        if size <= requested and in_features % size == 0:
            return size
    raise ValueError(f"no int4 group size in {GROUP_SIZES} divides {in_features} inputs")


def make_int4_linear(
    weight: Int4Weight,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
    shard_sizes: list[int] | None = None,
) -> QuantizedLinear:
    rows = weight.shape[0]
    if (
        weight.packed.device.type == "cpu"
        and dtype in CPU_KERNEL_DTYPES
        and rows % CPU_KERNEL_ROW_MULTIPLE == 0
    ):
        return CpuInt4Linear(weight, bias, dtype, shard_sizes)
    return Int4Linear(weight, bias, dtype, shard_sizes)


class _Int4Base(QuantizedLinear):
    """What both int4 layouts share: the shape and group size of the weight."""

    def __init__(
        self,
        weight: Int4Weight,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        shard_sizes: list[int] | None = None,
    ):
        out_features, in_features = weight.shape
        super().__init__(in_features, out_features, bias, dtype, shard_sizes)
        self.group_size = weight.group_size

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, group_size={self.group_size}"


class Int4Linear(_Int4Base):
    """The portable format: cpu_kernel's float32 matmul on CPUs, else maas_kernels.int4_matmul."""

    def __init__(
        self,
        weight: Int4Weight,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        shard_sizes: list[int] | None = None,
    ):
        super().__init__(weight, bias, dtype, shard_sizes)
        self.register_buffer("packed", weight.packed)
        # In the model dtype: at group 64, float32 scale + min would be 0.125 bytes a
        # weight on top of the 0.5 of the levels, bf16 halves that.
        self.register_buffer("scales", weight.scales.to(dtype))
        self.register_buffer("mins", weight.mins.to(dtype))

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:
        weight = (self.packed, self.scales, self.mins, self.group_size)
        if cpu_kernel.handles(rows, self.in_features) and self.scales.dtype == torch.float32:
            return cpu_kernel.int4_matmul(rows, *weight, self.int8_activations)
        return int4_matmul(rows, *weight)


class CpuInt4Linear(_Int4Base):
    """The layout of torch's CPU int4 kernel (_weight_int4pack_mm_for_cpu).

    Its levels are tiled in an order of its own (which depends on the CPU's
    vector width), so this module can only run that kernel: it is a GEMV per
    row, ~1.5x faster than a bf16 matmul for a decode token and 2-3x slower
    for a long prefill chunk, where it matches a float32 matmul.
    """

    def __init__(
        self,
        weight: Int4Weight,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        shard_sizes: list[int] | None = None,
    ):
        super().__init__(weight, bias, dtype, shard_sizes)
        levels = unpack_int4(weight.packed).to(torch.int32)
        self.register_buffer("qweight", torch._convert_weight_to_int4pack_for_cpu(levels, 1))
        # The kernel computes (level - 8) * scale + zero; ours is level * scale + min.
        zeros = weight.mins + 8 * weight.scales
        scale_zeros = torch.stack((weight.scales, zeros), dim=-1).transpose(0, 1)
        self.register_buffer("scale_zeros", scale_zeros.contiguous().to(dtype))  # [K/G, N, 2]

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(
            rows, self.qweight, self.group_size, self.scale_zeros
        )
