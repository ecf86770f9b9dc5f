"""native/qdot.cpp's interleaved kernels (matmul.h's WEIGHT_INT4_COLS8 and
WEIGHT_INT8_COLS8): a checkpoint's Q4_1 and Q8_0 blocks with 8 output rows a vector,
against activations rounded to int16, for the narrow steps of a weight computed in bf16
(native_layers._keep_blocks). Their integer sums are exact, so they equal
test_qdot.py's float64 twin of the int16 rounding as tightly as the row-major kernel
does, at any width (above 8 rows, each group of output rows is dotted in passes)."""

import pytest
import torch

from maas_kernels.quant_int4_ref import dequantize_int4, quantize_int4
from maas_services.engine.native_layers import NativeHalves, NativeHead, _cols8
from maas_services.engine.quantization.checkpoint_blocks import BF16_BLOCKS_ROWS
from maas_services.engine.quantization.int4 import Int4Weight
from tests.unit.engine.test_checkpoint_blocks import layer_with_blocks
from tests.unit.engine.test_native_layers import rotary
from tests.unit.engine.test_qdot import (
    INT16_TOP,
    assert_tight,
    int4_reference,
    int8_group_weight,
    int8_reference,
    needs_kernels,
    strided,
    through_weight,
)
from tests.unit.engine.test_qdot16 import assert_within_rounding, head_case
from tests.unit.kernels.test_bf16_panel import needs_bf16_panel

pytestmark = needs_kernels

ROWS = (1, 2, 4, 5, 8, 9, 13)
INPUTS = (96, 576, 1536)
OUTPUTS = 40  # five groups of 8


def interleaved(x: torch.Tensor, block) -> torch.Tensor:
    """x @ the block^T through its interleaved copy (kept alive for the call)."""
    kept: list = []
    return through_weight(x, _cols8(block, kept), block_rows(block), x.shape[1])


def block_rows(block) -> int:
    return (block.packed if isinstance(block, Int4Weight) else block.q).shape[0]


def int4_blocks(k: int, seed: int, outputs: int = OUTPUTS) -> Int4Weight:
    weight = torch.randn(outputs, k, generator=torch.Generator().manual_seed(seed))
    return Int4Weight(*quantize_int4(weight, 32), 32)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("k", INPUTS)
def test_interleaved_int4_blocks_equal_the_float64_twin(rows, k):
    block = int4_blocks(k, seed=k)
    x = strided(rows, k, seed=rows)
    got = interleaved(x, block)
    want = int4_reference(x, block.packed, block.scales, block.mins, 32, INT16_TOP)
    assert_tight(got, want)
    assert_within_rounding(got, x, dequantize_int4(block.packed, block.scales, block.mins, 32))


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("k", INPUTS)
def test_interleaved_int8_blocks_equal_the_float64_twin(rows, k):
    block = int8_group_weight(k, 32, seed=k, outputs=OUTPUTS)
    x = strided(rows, k, seed=rows)
    got = interleaved(x, block)
    assert_tight(got, int8_reference(x, block.q, block.scale, 32, INT16_TOP))
    assert_within_rounding(got, x, block.dequantize())


def test_the_interleaved_extremes_do_not_overflow():
    # Level 15 and int8's -128 against activations at +-32767, 32 products a lane a block.
    k = 64
    x = torch.ones(2, k)
    x[1] = -1
    levels = Int4Weight(torch.full((8, k // 2), 0xFF, dtype=torch.uint8), *[None] * 2, 32)
    levels.scales, levels.mins = torch.ones(8, k // 32), torch.zeros(8, k // 32)
    got = interleaved(x, levels)
    assert torch.equal(got, torch.tensor([[15.0 * k] * 8, [-15.0 * k] * 8]))
    q = int8_group_weight(k, 32, outputs=8)
    q.q.fill_(-128)
    q.scale.fill_(1.0)
    got = interleaved(x, q)
    assert torch.equal(got, torch.tensor([[-128.0 * k] * 8, [128.0 * k] * 8]))


@needs_bf16_panel
@pytest.mark.parametrize("tokens", (1, 5, BF16_BLOCKS_ROWS, BF16_BLOCKS_ROWS + 1))
def test_beside_a_bf16_copy_only_narrow_steps_read_the_interleaved_blocks(tokens):
    built, blocks = layer_with_blocks()
    both = NativeHalves.of(built, wide_bf16=True, blocks=blocks, blocks_int16=True)
    copy = NativeHalves.of(built, wide_bf16=True)
    floats = NativeHalves.of(built)
    generator = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, built.input_layernorm.weight.shape[0], generator=generator)
    cos, sin = rotary(tokens, built.self_attn.head_dim)
    got = both.inputs(x, None, cos, sin)
    for a, b, exact in zip(
        got[:3], copy.inputs(x, None, cos, sin)[:3], floats.inputs(x, None, cos, sin)[:3],
        strict=True,
    ):  # fmt: skip
        if tokens > BF16_BLOCKS_ROWS:
            assert torch.equal(a, b)
        else:  # the blocks' float32 weights, int16 activations: nearer float32 than bf16
            assert (a - exact).abs().max() < (b - exact).abs().max()
    assert both.copy_bytes == copy.copy_bytes + sum(
        t.nbytes for block in blocks.values() for t in vars(block).values()
        if isinstance(t, torch.Tensor)
    )  # fmt: skip


@needs_bf16_panel
@pytest.mark.parametrize("rows", (1, BF16_BLOCKS_ROWS, BF16_BLOCKS_ROWS + 1))
def test_a_bf16_head_reads_its_interleaved_q8_0_blocks_in_narrow_steps(rows):
    block, weight, x = head_case(rows, OUTPUTS)
    got = NativeHead(weight, bf16=True, block=block, int16=True)(x)
    copy = NativeHead(weight, bf16=True, block=None)(x)
    if rows <= BF16_BLOCKS_ROWS:
        assert torch.equal(got, interleaved(x, block))
    else:
        assert torch.equal(got, copy)
