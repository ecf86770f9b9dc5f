"""cpu_kernel: the AVX2 float32 int8/int4 matmuls equal dequantize + F.linear."""

import pytest
import torch
import torch.nn.functional as F

from kernels.quant_int4_ref import dequantize_int4
from kernels.quant_int8_ref import dequantize_int8
from services.engine.quantization import cpu_kernel
from services.engine.quantization.int4 import Int4Linear, Int4Weight, make_int4_linear
from services.engine.quantization.int8 import Int8Linear
from tests.unit.engine.test_quantization import assert_close_relative, random_weight

AVX2 = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
needs_avx2 = pytest.mark.skipif(not AVX2, reason="the kernels are for x86 CPUs with AVX2")
# Only the order of the float32 sums differs from dequantize + matmul.
TOLERANCE = 1e-5
# 1: a decode token; 3 and 6: a group of four rows with and without a remainder; the
# kernel's last row count; one past it, a wide batch and a prefill chunk: dequantized
# tiles + matmul.
ROWS = [1, 3, 6, cpu_kernel.MAX_KERNEL_ROWS, cpu_kernel.MAX_KERNEL_ROWS + 1, 64, 300]
# 37 outputs fit one tile, of the kernel's and of the dequantized ones (and need not
# split evenly between threads); 200 take several, the last one short.
OUTPUTS = [37, 200]


@needs_avx2
def test_the_kernels_build_and_run_float32_rows_on_this_cpu():
    assert cpu_kernel.library() is not None
    assert cpu_kernel.handles(torch.zeros(1, 64), 64)
    assert not cpu_kernel.handles(torch.zeros(1, 64, dtype=torch.bfloat16), 64)


@needs_avx2
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("outputs", OUTPUTS)
def test_int8_kernel_equals_dequantize_and_matmul(rows, outputs):
    layer = Int8Linear(random_weight(outputs, 576), None, torch.float32)
    x = torch.randn(rows, 576)
    expected = F.linear(x, dequantize_int8(layer.qweight, layer.scale))
    assert_close_relative(layer(x), expected, TOLERANCE)


@needs_avx2
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("outputs", OUTPUTS)
def test_int4_kernel_equals_dequantize_and_matmul(rows, group_size, outputs):
    int4 = Int4Weight.quantize(random_weight(outputs, 1536, seed=group_size), group_size)
    layer = make_int4_linear(int4, None, torch.float32)
    assert isinstance(layer, Int4Linear)
    x = torch.randn(rows, 1536)
    expected = F.linear(x, dequantize_int4(int4.packed, int4.scales, int4.mins, group_size))
    assert_close_relative(layer(x), expected, TOLERANCE)


@needs_avx2
def test_kernels_take_rows_that_are_not_contiguous():
    layer = Int8Linear(random_weight(40, 64), None, torch.float32)
    x = torch.randn(64, 5).T  # a view with a column stride of 5
    expected = F.linear(x, dequantize_int8(layer.qweight, layer.scale))
    assert_close_relative(layer(x), expected, TOLERANCE)


@needs_avx2
def test_two_threads_give_the_one_thread_result():
    int4 = Int4Weight.quantize(random_weight(1000, 576), 32)  # six tiles
    layer = make_int4_linear(int4, None, torch.float32)
    x = torch.randn(7, 576)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = layer(x)
        torch.set_num_threads(2)
        two = layer(x)
    finally:
        torch.set_num_threads(threads)
    # Each output is summed by one thread, in one order, whatever the thread count.
    assert torch.equal(one, two)


def test_without_a_compiler_the_layers_dequantize_and_match(monkeypatch, tmp_path):
    monkeypatch.setenv("MAAS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    cpu_kernel.library.cache_clear()
    try:
        assert cpu_kernel.library() is None
        layer = Int8Linear(random_weight(40, 64), None, torch.float32)
        x = torch.randn(2, 64)
        expected = F.linear(x, dequantize_int8(layer.qweight, layer.scale))
        assert_close_relative(layer(x), expected, TOLERANCE)
    finally:
        cpu_kernel.library.cache_clear()
