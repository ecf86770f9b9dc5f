"""The bf16 panel GEMM (kernels/native/bf16.h): bit for bit the arithmetic it claims, and
within bf16's bound of the float32 product. Skipped where the CPU has no AVX512-BF16.

On an AMX CPU the panels whose k is a multiple of 32 run as AMX tiles (amx_panel.cpp),
which sum the same products in the hardware's own order: there they are held to float32's
summation bound instead of bit for bit (test_amx_tiles_sum_the_same_products), and k = 72
keeps the vdpbf16ps kernel's bit-level test running."""

import ctypes

import pytest
import torch

from maas_kernels.native import bindings
from maas_kernels.quant_int4_ref import quantize_int4
from maas_kernels.quant_int8_ref import quantize_int8
from maas_services.engine.native_layers import wide_bf16_kernel
from maas_services.engine.quantization import cpu_kernel

# The bf16 tests' one condition: a library with the bf16 panel GEMM (an AVX512-BF16 CPU).
needs_bf16_panel = pytest.mark.skipif(
    not wide_bf16_kernel(), reason="the library has no bf16 panel GEMM on this CPU"
)
pytestmark = needs_bf16_panel

ROW_KERNEL_ROWS = 4  # above this the panel GEMM runs
# Rows: 8 (one ymm block), 24 (a pair of blocks' tail), 40 and 64 (pairs of 16 and a last
# 8), 600 (past matmul.cpp's ROW_BLOCK of 512: two passes over the weight).
ROWS = (5, 8, 24, 40, 64, 600)
# Outputs: one, a short panel's tail, and more than a panel (SmolLM2's o_proj).
OUTPUTS = (1, 37, 576)


def linear(weight: bindings.Weight, x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape[0], weight.n)
    bindings.library().weight_linear(
        ctypes.addressof(weight),
        x.data_ptr(),
        x.shape[0],
        x.stride(0),
        out.data_ptr(),
        ROW_KERNEL_ROWS,
        cpu_kernel.PANEL_BYTES,
        torch.get_num_threads(),
    )
    return out


def float32_weight(w: torch.Tensor, wide_bf16: bool, copy: torch.Tensor | None):
    """w as the layers describe it; the caller keeps w and its bf16 copy alive."""
    n, k = w.shape
    bf16 = 0 if copy is None else copy.data_ptr()
    return bindings.Weight(bindings.FLOAT32, w.data_ptr(), 0, 0, 0, 0, n, k, 0, wide_bf16, bf16)


def emulated(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """vdpbf16ps' arithmetic, one input pair at a time: both operands rounded to bf16
    (nearest even), each output's sum in float32, the odd input's product added before the
    even one's, each addition rounded (bf16 products are exact in float32)."""
    xb, wb = x.to(torch.bfloat16).float(), w.to(torch.bfloat16).float()
    acc = torch.zeros(x.shape[0], w.shape[0])
    for j in range(0, x.shape[1], 2):
        acc += xb[:, j + 1, None] * wb[None, :, j + 1]
        acc += xb[:, j, None] * wb[None, :, j]
    return acc


def bf16_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """How far each output may be from the float32 product: rounding both operands to bf16
    (unit roundoff u = 2^-9) moves each product by at most (2u + u^2) of its magnitude, and
    both sides' float32 sums of k terms by at most k 2^-24 of the terms' sum of magnitudes
    (first order), so |bf16 - float32| <= (2^-8 + 2^-18 + 2 k 2^-24) (|x| @ |w|^T)."""
    k = x.shape[1]
    return (2**-8 + 2**-18 + 2 * k * 2**-24) * (x.abs() @ w.abs().T)


def runs_amx(k: int) -> bool:
    return wide_bf16_kernel() == "amx" and k % 32 == 0


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n", OUTPUTS)
@pytest.mark.parametrize("k", (64, 72, 576))
def test_the_panel_computes_vdpbf16ps_arithmetic_bit_for_bit(rows, n, k):
    if runs_amx(k):
        pytest.skip("AMX tiles: test_amx_tiles_sum_the_same_products")
    g = torch.Generator().manual_seed(rows * n + k)
    x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
    want = emulated(x, w)
    # The float32 weight's bf16 copy made at load, and the same rounded per panel per call.
    for copy in (w.to(torch.bfloat16), None):
        assert torch.equal(linear(float32_weight(w, True, copy), x), want)


@pytest.mark.skipif(wide_bf16_kernel() != "amx", reason="no AMX tiles on this CPU")
@pytest.mark.parametrize("rows", (5, 16, 40, 64, 600))
@pytest.mark.parametrize("n", OUTPUTS)
def test_amx_tiles_sum_the_same_products(rows, n):
    """UNTESTED where written (no AMX CPU): the tiles' sums of the same bf16 products are
    within float32's summation bound of the emulation, k 2^-24 of the sum of magnitudes."""
    g = torch.Generator().manual_seed(rows * n)
    x, w = torch.randn(rows, 576, generator=g), torch.randn(n, 576, generator=g)
    copy = w.to(torch.bfloat16)
    ours = linear(float32_weight(w, True, copy), x)
    xb, wb = x.to(torch.bfloat16).float(), copy.float()
    bound = 2 * 576 * 2**-24 * (xb.abs() @ wb.abs().T)
    assert ((ours - emulated(x, w)).abs() <= bound).all()


@pytest.mark.parametrize("rows", (8, 64))
def test_int8_and_int4_panels_are_dequantized_then_rounded_to_bf16(rows):
    g = torch.Generator().manual_seed(rows)
    x, dense = torch.randn(rows, 576, generator=g), torch.randn(300, 576, generator=g) * 0.02
    q, scale = quantize_int8(dense)
    packed, scales, mins = quantize_int4(dense, 32)
    lib = bindings.library()
    int8_dense, int4_dense = torch.empty(300, 576), torch.empty(300, 576)
    lib.int8_dequantize_f32(q.data_ptr(), scale.data_ptr(), 0, 300, 576, int8_dense.data_ptr(), 1)
    lib.int4_dequantize_f32(
        packed.data_ptr(), scales.data_ptr(), mins.data_ptr(), 32, 300, 576,
        int4_dense.data_ptr(), 1,
    )  # fmt: skip
    int8 = bindings.Weight(
        bindings.INT8, q.data_ptr(), scale.data_ptr(), 0, 0, 0, 300, 576, 0, 1, 0
    )
    int4 = bindings.Weight(
        bindings.INT4, packed.data_ptr(), scales.data_ptr(), mins.data_ptr(), 32, 0, 300, 576,
        0, 1, 0,
    )  # fmt: skip
    if runs_amx(576):
        pytest.skip("AMX tiles: test_amx_tiles_sum_the_same_products")
    assert torch.equal(linear(int8, x), emulated(x, int8_dense))
    assert torch.equal(linear(int4, x), emulated(x, int4_dense))


@pytest.mark.parametrize("rows", (8, 64, 600))
def test_the_panel_is_within_bf16s_bound_of_float32(rows):
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 1536, generator=g), torch.randn(576, 1536, generator=g)
    reference = x.double() @ w.double().T
    copy = w.to(torch.bfloat16)
    ours = linear(float32_weight(w, True, copy), x)
    error = (ours.double() - reference).abs()
    assert (error <= bf16_bound(x, w).double()).all()
    # And it is bf16: float32's panel lands some 2^8 times closer.
    float32 = linear(float32_weight(w, False, None), x)
    assert (float32.double() - reference).abs().max() < error.max() / 16


@pytest.mark.parametrize("rows", range(1, ROW_KERNEL_ROWS + 1))
@pytest.mark.parametrize("n", OUTPUTS + (3072,))
@pytest.mark.parametrize("k", (64, 72, 576, 1536))
def test_narrow_rows_give_the_panels_sums_bit_for_bit(rows, n, k):
    """The rows the row kernels take run bf16_rows (k a multiple of 32) or the panel (72):
    the same arithmetic, so each row's outputs are those it gets inside a wide step, on
    one thread or two."""
    g = torch.Generator().manual_seed(rows * n + k)
    x, w = torch.randn(40, k, generator=g), torch.randn(n, k, generator=g)
    weight = float32_weight(w, True, copy := w.to(torch.bfloat16))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = linear(weight, x[:rows])
        torch.set_num_threads(2)
        two = linear(weight, x[:rows])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    assert torch.equal(one, emulated(x[:rows], copy.float()))
    if not runs_amx(k):
        assert torch.equal(one, linear(weight, x)[:rows])
    # Not float32's: the rows are in bf16 too.
    assert not torch.equal(one, linear(float32_weight(w, False, None), x[:rows]))


def test_every_thread_count_gives_the_same_bits():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(64, 576, generator=g), torch.randn(3072, 576, generator=g)
    copy = w.to(torch.bfloat16)
    weight = float32_weight(w, True, copy)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = linear(weight, x)
        torch.set_num_threads(2)
        assert torch.equal(one, linear(weight, x))
    finally:
        torch.set_num_threads(threads)
