"""Steps from a checkpoint's own blocks (matmul.h's NativeWeight.blocks): narrow ones
through the blocks' row kernel, up to BLOCKS_ROWS through the panel GEMM dequantizing
them, which sums exactly as the float32 weight the blocks dequantize to would, and wider
ones from that float32 weight."""

import pytest
import torch

from maas_kernels.native import bindings
from maas_kernels.quant_int4_ref import dequantize_int4
from maas_services.engine import native_layers
from maas_services.engine.native_layers import NativeHalves, NativeHead
from maas_services.engine.quantization.checkpoint_blocks import (
    BLOCKS_ROW_KERNEL_ROWS,
    BLOCKS_ROWS,
)
from maas_services.engine.quantization.int4 import Int4Weight
from tests.unit.engine.test_native_layers import PROJECTIONS, layer, rotary
from tests.unit.engine.test_qdot import int8_group_weight

pytestmark = pytest.mark.skipif(
    bindings.library() is None, reason="no native library (not AVX2, or no compiler)"
)

ROWS = (1, 3, 4, 5, BLOCKS_ROW_KERNEL_ROWS, BLOCKS_ROW_KERNEL_ROWS + 1, 17, BLOCKS_ROWS, 64)
# Sums of 256 products of order 1 in two orders (int4's blocks: the scale times the
# levels' dot product, plus the minimum times the inputs' sum), each rounded in float32:
# their difference can reach ~256 * 2^-24 * |products| (measured up to 1.6e-5).
ATOL = 1e-4


def int4_block(outputs: int, k: int) -> Int4Weight:
    """Q4_1's shape of weight: levels 0..15, a scale and a minimum per 32 inputs, each a
    float16 value as the file stores them (level * scale is then exact in float32)."""
    weight = torch.randn(outputs, k, generator=torch.Generator().manual_seed(1))
    levels = Int4Weight.quantize(weight, 32)
    scales, mins = levels.scales.half().float(), levels.mins.half().float()
    return Int4Weight(levels.packed, scales, mins, 32)


def dense(block) -> torch.Tensor:
    """The float32 weight a loader dequantizes the block to."""
    if isinstance(block, Int4Weight):
        return dequantize_int4(block.packed, block.scales, block.mins, block.group_size)
    return block.dequantize()


def blocks_alone(block, x: torch.Tensor) -> torch.Tensor:
    """x @ the blocks^T through their row kernel at any width (the C entries cpu_kernel
    calls up to its own, lower, crossover)."""
    lib, (m, k) = bindings.library(), x.shape
    if isinstance(block, Int4Weight):
        n = block.packed.shape[0]
        arrays = (block.packed.data_ptr(), block.scales.data_ptr(), block.mins.data_ptr())
        entry = lib.int4_matmul_f32
    else:
        n = block.q.shape[0]
        arrays, entry = (block.q.data_ptr(), block.scale.data_ptr()), lib.int8_matmul_f32
    out = torch.empty(m, n)
    entry(x.data_ptr(), m, k, *arrays, block.group_size, n, k, out.data_ptr(), 2)
    return out


@pytest.mark.parametrize("kind", ["int4", "int8-g32"])
@pytest.mark.parametrize("rows", ROWS)
def test_steps_read_the_blocks_up_to_their_rows_with_the_float32_weights_sums(kind, rows):
    k, outputs = 256, 200
    block = int4_block(outputs, k) if kind == "int4" else int8_group_weight(k, 32, 3, outputs)
    weight = dense(block)
    torch.manual_seed(rows)
    x = torch.randn(rows, k)
    # The float32 weight zeroed: only a step that reads the blocks gets the weights.
    with_blocks = NativeHead(torch.zeros_like(weight), bf16=False, block=block)
    assert with_blocks.with_blocks == 1
    got = with_blocks(x)
    float32 = NativeHead(weight, bf16=False, block=None)(x)
    if rows > BLOCKS_ROWS:
        # Wider steps read the float32 weight (zeroed here).
        assert torch.equal(got, torch.zeros(rows, outputs))
        return
    if rows <= BLOCKS_ROW_KERNEL_ROWS:
        # The blocks' kernel, bit for bit, and float32's weights to float32's rounding.
        assert torch.equal(got, blocks_alone(block, x))
        torch.testing.assert_close(got, float32, rtol=1e-5, atol=ATOL)
    else:
        # The panel of the blocks dequantized: the float32 weight's sums exactly.
        assert torch.equal(got, float32)
    torch.testing.assert_close(got, x @ weight.T, rtol=1e-5, atol=ATOL)


def layer_with_blocks() -> tuple:
    """A float32 layer whose projections hold Q4_1 blocks' weights, and those blocks."""
    built = layer("float32", attention_bias=True)
    blocks = {}
    for name in PROJECTIONS:
        module = built.get_submodule(name)
        block = int4_block(module.out_features, module.in_features)
        module.weight.copy_(dense(block))  # the float32 model holds the blocks' weights
        blocks[module] = block
    return built, blocks


@pytest.mark.parametrize("tokens", (1, 5, BLOCKS_ROW_KERNEL_ROWS, BLOCKS_ROW_KERNEL_ROWS + 3))
def test_a_layer_with_its_projections_blocks_computes_its_float32_halves(tokens):
    built, blocks = layer_with_blocks()
    halves = NativeHalves.of(built, blocks=blocks)
    float32 = NativeHalves.of(built)
    assert halves.with_blocks == 4 and float32.with_blocks == 0
    assert halves.copy_bytes == sum(
        b.packed.nbytes + b.scales.nbytes + b.mins.nbytes for b in blocks.values()
    )
    torch.manual_seed(tokens)
    x = torch.randn(tokens, built.input_layernorm.weight.shape[0])
    cos, sin = rotary(tokens, built.self_attn.head_dim)
    got = halves.inputs(x, None, cos, sin)
    want = float32.inputs(x, None, cos, sin)
    for a, b in zip(got, want, strict=True):
        if tokens > BLOCKS_ROW_KERNEL_ROWS:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=ATOL)


def test_a_block_no_native_format_takes_leaves_the_weight_as_it_is():
    block = int4_block(64, 256)
    odd = Int4Weight(block.packed, block.scales, block.mins, 16)  # groups of 16: no kernel
    weight = bindings.Weight(bindings.FLOAT32, 0, 0, 0, 0, 0, 64, 256)
    assert native_layers._keep_blocks(weight, odd, []) == 0
    assert not weight.blocks
