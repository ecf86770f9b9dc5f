import pytest
import torch
import torch.nn.functional as F

from maas_kernels.quant_int8_ref import dequantize_int8, int8_matmul_reference, quantize_int8
from tests.unit.kernels.tolerances import assert_close
from tests.unit.kernels.triton_import import import_kernel

quant_int8 = import_kernel("quant_int8")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def test_quantize_keeps_every_weight_within_half_a_step():
    weight = torch.randn(16, 40, generator=torch.Generator().manual_seed(0))
    weight[3] = 0.0
    q, scale = quantize_int8(weight)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    assert q.min() >= -127
    # Each row's largest magnitude lands on the extreme level; the zero row stays zero.
    assert torch.equal(q.abs().amax(dim=1)[[0, 1, 2, 4]], torch.full((4,), 127, dtype=torch.int8))
    assert not q[3].any()
    error = (dequantize_int8(q, scale) - weight).abs()
    assert (error <= scale[:, None] / 2 + 1e-7).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_twin_is_a_linear_layer_over_the_dequantized_weight(dtype):
    q, scale = quantize_int8(torch.randn(12, 40))
    x = torch.randn(3, 40).to(dtype)
    expected = F.linear(x, dequantize_int8(q, scale).to(dtype))
    torch.testing.assert_close(int8_matmul_reference(x, q, scale), expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m, n, k",
    [
        (1, 64, 64),  # one decode token, one whole tile
        (5, 70, 100),  # nothing a multiple of its tile
        (70, 20, 130),  # two row tiles, three K tiles
    ],
)
def test_the_kernel_matches_its_twin(dtype, m, n, k):
    gen = torch.Generator().manual_seed(m + n + k)
    q, scale = quantize_int8(torch.randn(n, k, generator=gen) / k**0.5)
    x = torch.randn(m, k, generator=gen).to(dtype)
    actual = quant_int8.int8_matmul_triton(x, q, scale)
    # The twin in a half dtype rounds the dequantized weight to that dtype first;
    # the kernel never does (an int times a float32 scale), so its reference is
    # the twin in float32, rounded once at the end.
    assert_close(actual, int8_matmul_reference(x.float(), q, scale).to(dtype))


def test_the_kernel_keeps_leading_dimensions():
    q, scale = quantize_int8(torch.randn(24, 32))
    x = torch.randn(2, 3, 32)
    out = quant_int8.int8_matmul_triton(x, q, scale)
    assert out.shape == (2, 3, 24)
    assert_close(out, int8_matmul_reference(x, q, scale))
