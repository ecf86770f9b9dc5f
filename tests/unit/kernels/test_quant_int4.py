import pytest
import torch
import torch.nn.functional as F

from maas_kernels.quant_int4_ref import (
    dequantize_int4,
    int4_matmul_reference,
    quantize_int4,
    unpack_int4,
)
from tests.unit.kernels.tolerances import assert_close
from tests.unit.kernels.triton_import import import_kernel

quant_int4 = import_kernel("quant_int4")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def test_two_values_share_a_byte_low_nibble_first():
    # Levels 0..15 in order across one group: the quantized values are the levels.
    weight = torch.arange(16, dtype=torch.float32).repeat(2, 1)
    packed, scales, mins = quantize_int4(weight, group_size=16)
    assert packed.dtype == torch.uint8 and packed.shape == (2, 8)
    assert packed[0, 0] == 0x10  # element 0 low, element 1 high
    assert packed[0, 7] == 0xFE
    assert torch.equal(unpack_int4(packed), weight.to(torch.uint8))
    assert torch.equal(scales, torch.ones(2, 1)) and torch.equal(mins, torch.zeros(2, 1))


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_quantize_keeps_every_weight_within_half_a_step_of_its_group(group_size):
    weight = torch.randn(8, 256, generator=torch.Generator().manual_seed(group_size))
    weight[2, :group_size] = 0.75  # a constant group
    packed, scales, mins = quantize_int4(weight, group_size)
    assert scales.shape == mins.shape == (8, 256 // group_size)
    restored = dequantize_int4(packed, scales, mins, group_size)
    step = scales.repeat_interleave(group_size, dim=1)
    assert ((restored - weight).abs() <= step / 2 + 1e-6).all()
    assert torch.equal(restored[2, :group_size], weight[2, :group_size])


def test_quantize_refuses_a_group_that_does_not_divide_the_row():
    with pytest.raises(ValueError, match="divide"):
        quantize_int4(torch.randn(4, 96), group_size=64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_twin_is_a_linear_layer_over_the_dequantized_weight(dtype):
    packed, scales, mins = quantize_int4(torch.randn(12, 64), group_size=32)
    x = torch.randn(3, 64).to(dtype)
    expected = F.linear(x, dequantize_int4(packed, scales, mins, 32).to(dtype))
    torch.testing.assert_close(int4_matmul_reference(x, packed, scales, mins, 32), expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m, n, k, group_size",
    [
        (1, 64, 128, 128),  # one decode token, one group per row
        (5, 70, 192, 64),  # M and N not multiples of their tiles
        (70, 20, 96, 32),  # two row tiles; GGUF Q4_1's group
        (3, 16, 96, 48),  # a group that is not a power of two
    ],
)
def test_the_kernel_matches_its_twin(dtype, m, n, k, group_size):
    gen = torch.Generator().manual_seed(m + n + k)
    packed, scales, mins = quantize_int4(torch.randn(n, k, generator=gen) / k**0.5, group_size)
    x = torch.randn(m, k, generator=gen).to(dtype)
    actual = quant_int4.int4_matmul_triton(x, packed, scales, mins, group_size)
    # The twin in a half dtype rounds the dequantized weight to that dtype first;
    # the kernel keeps it in float32, so its reference is the twin in float32,
    # rounded once at the end.
    expected = int4_matmul_reference(x.float(), packed, scales, mins, group_size).to(dtype)
    assert_close(actual, expected)


def test_the_kernel_refuses_a_group_tl_dot_cannot_tile():
    packed, scales, mins = quantize_int4(torch.randn(16, 64), group_size=8)
    with pytest.raises(ValueError, match="multiple of 16"):
        quant_int4.int4_matmul_triton(torch.randn(2, 64), packed, scales, mins, 8)
