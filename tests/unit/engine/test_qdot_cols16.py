"""native/qdot.cpp's int8 interleaved kernel (matmul.h's WEIGHT_INT4_COLS16 and
WEIGHT_INT8_COLS16): a checkpoint's Q4_1 and Q8_0 blocks with 16 output rows a vector,
against activations rounded to int8 per block of 32 (vpdpbusd), for every step of a
weight with --wide-gemm int8 (native_layers._keep_blocks). Its integer
sums are exact, so it equals test_qdot.py's float64 twin of the int8 rounding as tightly
as the row kernels do, at any width; int8 weights ride as level + 128, and the offset's
share comes back out exactly enough for that too."""

import pytest
import torch

from maas_kernels.quant_int4_ref import dequantize_int4
from maas_services.engine.native_layers import NativeHalves, NativeHead, _cols16, wide_int8_kernel
from maas_services.engine.quantization.checkpoint_blocks import BF16_BLOCKS_ROWS
from tests.unit.engine.test_checkpoint_blocks import layer_with_blocks
from tests.unit.engine.test_native_layers import rotary
from tests.unit.engine.test_qdot import (
    INT8_TOP,
    assert_tight,
    int4_reference,
    int8_group_weight,
    int8_reference,
    needs_kernels,
    strided,
    through_weight,
)
from tests.unit.engine.test_qdot16 import assert_within_rounding, head_case
from tests.unit.engine.test_qdot_cols8 import block_rows, int4_blocks
from tests.unit.kernels.test_bf16_panel import needs_bf16_panel

pytestmark = [
    needs_kernels,
    pytest.mark.skipif(not wide_int8_kernel(), reason="the library has no wide int8 kernel"),
]

# Up to two passes of 12 rows and a remainder; inputs as the narrow kernels' tests.
ROWS = (1, 11, 12, 13, 30)
INPUTS = (96, 576, 1536)
OUTPUTS = 48  # three groups of 16


def wide(x: torch.Tensor, block) -> torch.Tensor:
    """x @ the block^T through its int8-kernel interleaved copy (kept alive for the call)."""
    kept: list = []
    return through_weight(x, _cols16(block, kept), block_rows(block), x.shape[1])


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("k", INPUTS)
def test_wide_int4_blocks_equal_the_float64_twin(rows, k):
    block = int4_blocks(k, seed=k, outputs=OUTPUTS)
    x = strided(rows, k, seed=rows)
    got = wide(x, block)
    want = int4_reference(x, block.packed, block.scales, block.mins, 32)
    assert_tight(got, want)
    weight = dequantize_int4(block.packed, block.scales, block.mins, 32)
    assert_within_rounding(got, x, weight, INT8_TOP)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("k", INPUTS)
def test_wide_int8_blocks_equal_the_float64_twin(rows, k):
    block = int8_group_weight(k, 32, seed=k, outputs=OUTPUTS)
    x = strided(rows, k, seed=rows)
    got = wide(x, block)
    assert_tight(got, int8_reference(x, block.q, block.scale, 32))
    assert_within_rounding(got, x, block.dequantize(), INT8_TOP)


def test_the_wide_extremes_do_not_overflow():
    # Level 15 and int8's -128 and 127 (255 and 0 once offset) against activations at
    # +-127, 32 products a lane a block.
    k = 64
    x = torch.ones(2, k)
    x[1] = -1
    block = int4_blocks(k, seed=0, outputs=OUTPUTS)
    block.packed.fill_(0xFF)
    block.scales.fill_(1.0)
    block.mins.fill_(0.0)
    got = wide(x, block)
    assert torch.equal(got, torch.tensor([[15.0 * k] * OUTPUTS, [-15.0 * k] * OUTPUTS]))
    for level in (-128, 127):
        q = int8_group_weight(k, 32, outputs=16)
        q.q.fill_(level)
        q.scale.fill_(1.0)
        assert torch.equal(wide(x, q), torch.tensor([[level * k] * 16, [-level * k] * 16]).float())


def test_two_threads_give_the_bits_one_does():
    block = int4_blocks(576, seed=1, outputs=OUTPUTS)
    x = strided(30, 576, seed=2)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = wide(x, block)
        torch.set_num_threads(2)
        assert torch.equal(wide(x, block), one)
    finally:
        torch.set_num_threads(threads)


@needs_bf16_panel
def test_with_wide_int8_every_step_reads_the_blocks_alike_at_every_width():
    built, blocks = layer_with_blocks()
    int8 = NativeHalves.of(built, True, blocks, blocks_int16=True, wide_int8=True)
    bf16 = NativeHalves.of(built, True, blocks, blocks_int16=True)
    floats = NativeHalves.of(built)
    # One layout of the blocks (the int4 levels, scales and mins), no bf16 copies.
    assert int8.copy_bytes == sum(
        t.nbytes for block in blocks.values() for t in vars(block).values()
        if isinstance(t, torch.Tensor)
    ) < bf16.copy_bytes  # fmt: skip
    tokens = 40
    x = torch.randn(tokens, built.input_layernorm.weight.shape[0])
    cos, sin = rotary(tokens, built.self_attn.head_dim)
    wide = int8.inputs(x, None, cos, sin)
    for got, exact in zip(wide[:3], floats.inputs(x, None, cos, sin)[:3], strict=True):
        # The float32 weights, activations rounded to int8: near float32.
        assert (got - exact).abs().max() <= 0.02 * exact.abs().max()
    # Each row as a step of its own, and the first 13 as one: the wide step's rows.
    for first, rows in ((0, 1), (7, 1), (0, BF16_BLOCKS_ROWS + 1)):
        part = slice(first, first + rows)
        narrow = int8.inputs(x[part], None, cos[part], sin[part])
        for a, b in zip(narrow, wide, strict=True):
            assert torch.equal(a, b[part])


@needs_bf16_panel
@pytest.mark.parametrize("rows", (1, BF16_BLOCKS_ROWS + 1, 33))
def test_a_head_with_wide_int8_reads_its_q8_0_blocks_at_every_width(rows):
    block, weight, x = head_case(rows, OUTPUTS)
    head = NativeHead(weight, bf16=True, block=block, int16=True, wide_int8=True)
    assert (
        head.copy_bytes == sum(t.nbytes for t in (block.q, block.scale)) + block.scale.nbytes
    )  # the levels, their scales and the offset's minimums
    assert torch.equal(head(x), wide(x, block))
