"""cpu_kernel: the AVX2 float32 int8/int4 matmuls equal dequantize + F.linear."""

import pytest
import torch
import torch.nn.functional as F

from maas_kernels.native import bindings
from maas_kernels.quant_int4_ref import dequantize_int4
from maas_kernels.quant_int8_ref import dequantize_int8
from maas_services.engine.quantization import cpu_kernel
from maas_services.engine.quantization.int4 import (
    Int4Linear,
    Int4Weight,
    int4_group_size,
    make_int4_linear,
)
from maas_services.engine.quantization.int8 import Int8Linear
from tests.unit.engine.test_qdot import int8_group_weight
from tests.unit.engine.test_quantization import assert_close_relative, random_weight

AVX2 = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
needs_avx2 = pytest.mark.skipif(not AVX2, reason="the kernels are for x86 CPUs with AVX2")
# Only the order of the float32 sums differs from dequantize + matmul.
TOLERANCE = 1e-5
# 1: a decode token; 3, 5, 6, 7: the micro-kernels' blocks of four rows with and without
# a remainder; then wide decode batches, a prefill chunk, and one longer than the GEMM's
# 512-row blocks.
ROWS = [1, 3, 5, 6, 7, 16, 33, 64, 300, 600]
# 37 outputs fit one tile or panel (and need not split evenly between threads or into
# the micro-kernel's three weight rows); 200 take several, the last one short.
OUTPUTS = [37, 200]
INPUTS = [576, 1536]
# Each kernel at every row count, whichever the layers pick for it.
ROW_KERNEL = 10**9
PANEL_GEMM = 0
KERNELS = pytest.mark.parametrize("row_kernel_rows", [ROW_KERNEL, PANEL_GEMM], ids=["rows", "gemm"])


@needs_avx2
def test_the_kernels_build_and_run_float32_rows_on_this_cpu():
    assert bindings.library() is not None
    assert cpu_kernel.handles(torch.zeros(1, 64), 64)
    assert not cpu_kernel.handles(torch.zeros(1, 64, dtype=torch.bfloat16), 64)


@needs_avx2
@KERNELS
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("outputs", OUTPUTS)
@pytest.mark.parametrize("inputs", INPUTS)
def test_int8_kernel_equals_dequantize_and_matmul(
    monkeypatch, row_kernel_rows, rows, outputs, inputs
):
    monkeypatch.setattr(cpu_kernel, "MAX_ROW_KERNEL_ROWS", row_kernel_rows)
    layer = Int8Linear(random_weight(outputs, inputs), None, torch.float32)
    x = torch.randn(rows, inputs)
    expected = F.linear(x, dequantize_int8(layer.qweight, layer.scale))
    assert_close_relative(layer(x), expected, TOLERANCE)


@needs_avx2
@KERNELS
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("outputs", OUTPUTS)
@pytest.mark.parametrize(("group_size", "inputs"), [(32, 576), (32, 1536), (64, 576)])
def test_int8_with_group_scales_equals_its_weights_and_matmul(
    monkeypatch, row_kernel_rows, rows, outputs, group_size, inputs
):
    # A GGUF file's Q8_0 blocks: int8 levels and a scale per 32 inputs.
    weight = int8_group_weight(inputs, group_size, seed=rows, outputs=outputs)
    monkeypatch.setattr(cpu_kernel, "MAX_ROW_KERNEL_ROWS", row_kernel_rows)
    layer = Int8Linear(weight, None, torch.float32)
    x = torch.randn(rows, inputs)
    assert_close_relative(layer(x), F.linear(x, weight.dequantize()), TOLERANCE)
    with torch.no_grad():  # where no kernel runs: the same weights, dequantized
        assert_close_relative(
            layer.double()(x.double()).float(), F.linear(x, weight.dequantize()), TOLERANCE
        )


@needs_avx2
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_the_row_kernel_sums_inputs_past_its_last_whole_set_of_chains(rows):
    # 584 = 18 * 32 + 8: each row's chains cover 576 inputs, one vector of 8 is left over.
    layer = Int8Linear(random_weight(37, 584), None, torch.float32)
    x = torch.randn(rows, 584)
    expected = F.linear(x, dequantize_int8(layer.qweight, layer.scale))
    assert_close_relative(layer(x), expected, TOLERANCE)


@needs_avx2
@KERNELS
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("outputs", OUTPUTS)
@pytest.mark.parametrize("inputs", INPUTS)
def test_int4_kernel_equals_dequantize_and_matmul(
    monkeypatch, row_kernel_rows, rows, group_size, outputs, inputs
):
    monkeypatch.setattr(cpu_kernel, "MAX_ROW_KERNEL_ROWS", row_kernel_rows)
    group_size = int4_group_size(inputs, group_size)  # 576 inputs take 64 for 128
    int4 = Int4Weight.quantize(random_weight(outputs, inputs, seed=group_size), group_size)
    layer = make_int4_linear(int4, None, torch.float32)
    assert isinstance(layer, Int4Linear)
    x = torch.randn(rows, inputs)
    expected = F.linear(x, dequantize_int4(int4.packed, int4.scales, int4.mins, group_size))
    assert_close_relative(layer(x), expected, TOLERANCE)


@needs_avx2
@KERNELS
def test_kernels_take_rows_that_are_not_contiguous(monkeypatch, row_kernel_rows):
    monkeypatch.setattr(cpu_kernel, "MAX_ROW_KERNEL_ROWS", row_kernel_rows)
    layer = Int8Linear(random_weight(40, 64), None, torch.float32)
    x = torch.randn(64, 5).T  # a view with a column stride of 5
    expected = F.linear(x, dequantize_int8(layer.qweight, layer.scale))
    assert_close_relative(layer(x), expected, TOLERANCE)


@needs_avx2
@KERNELS
def test_two_threads_give_the_one_thread_result(monkeypatch, row_kernel_rows):
    monkeypatch.setattr(cpu_kernel, "MAX_ROW_KERNEL_ROWS", row_kernel_rows)
    int4 = Int4Weight.quantize(random_weight(1000, 576), 32)  # several tiles and panels
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


def test_without_a_compiler_the_layers_dequantize_and_match(without_a_compiler):
    assert bindings.library() is None
    layer = Int8Linear(random_weight(40, 64), None, torch.float32)
    x = torch.randn(2, 64)
    expected = F.linear(x, dequantize_int8(layer.qweight, layer.scale))
    assert_close_relative(layer(x), expected, TOLERANCE)
