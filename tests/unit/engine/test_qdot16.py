"""native/qdot.cpp's int16 rounding (--kernel-activations int16): int8 and int4 weights
against activations rounded to int16 per block of 32, through a NativeWeight whose
integer16 asks for it (weight_linear) and through a checkpoint's blocks. The twins and
bounds are test_qdot.py's, at int16's top level: the bound is 258 times tighter than
int8's, and the twin as tight as before."""

import pytest
import torch

from maas_kernels.quant_int4_ref import dequantize_int4
from maas_services.engine.native_layers import NativeHalves, NativeHead
from maas_services.engine.quantization.checkpoint_blocks import BLOCKS_ROW_KERNEL_ROWS
from tests.unit.engine.test_checkpoint_blocks import dense, layer_with_blocks
from tests.unit.engine.test_native_layers import rotary
from tests.unit.engine.test_qdot import (
    INT4_CASES,
    INT16_TOP,
    OUTPUTS,
    ROWS,
    assert_tight,
    call_int4,
    call_int8,
    int4_reference,
    int4_weight,
    int8_group_weight,
    int8_reference,
    int8_weight,
    needs_kernels,
    rounding_bound,
    strided,
)

pytestmark = needs_kernels


def assert_within_rounding(
    got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, top: int = INT16_TOP
) -> None:
    """got is within the activations' rounding to -top..top of the exact x @ w^T."""
    exact = x.double() @ w.double().T
    slack = 1e-5 * exact.abs().max()
    assert ((got.double() - exact).abs() <= rounding_bound(x, w, top) + slack).all()


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("group", "k"), [(0, 96), (0, 1536), (32, 576), (64, 576)])
def test_int8_weights_equal_the_float64_twin_and_stay_in_the_rounding_bound(rows, group, k):
    if group:
        weight = int8_group_weight(k, group, seed=k)
        q, scale, w = weight.q, weight.scale, weight.dequantize()
    else:
        q, scale = int8_weight(k)
        w = q.float() * scale[:, None]
    x = strided(rows, k, seed=rows)
    got = call_int8(x, q, scale, group, INT16_TOP)
    assert_tight(got, int8_reference(x, q, scale, group, INT16_TOP))
    assert_within_rounding(got, x, w)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("group", "k"), INT4_CASES)
def test_int4_weights_equal_the_float64_twin_and_stay_in_the_rounding_bound(rows, group, k):
    packed, scales, mins = int4_weight(k, group)
    x = strided(rows, k, seed=rows)
    got = call_int4(x, packed, scales, mins, group, INT16_TOP)
    assert_tight(got, int4_reference(x, packed, scales, mins, group, INT16_TOP))
    assert_within_rounding(got, x, dequantize_int4(packed, scales, mins, group))


def test_the_extremes_do_not_overflow():
    # Level 15 and int8's -128..127 against activations at +-32767: each madd lane's
    # two products and the block's four lanes stay far inside int32.
    k = 64
    packed = torch.full((1, k // 2), 0xFF, dtype=torch.uint8)
    ones = torch.ones(1, k // 32)
    x = torch.ones(2, k)
    x[1] = -1
    got = call_int4(x, packed, ones, torch.zeros(1, k // 32), 32, INT16_TOP)
    torch.testing.assert_close(got[:, 0], torch.tensor([15.0 * k, -15.0 * k]))
    q = torch.full((2, k), -128, dtype=torch.int8)
    q[1] = 127
    got = call_int8(x, q, torch.ones(2), 0, INT16_TOP)
    torch.testing.assert_close(got[0], torch.tensor([-128.0 * k, 127.0 * k]))
    x[0, :32] = 0  # an all-zero block: scale 0, no division by it
    torch.testing.assert_close(
        call_int8(x, q, torch.ones(2), 0, INT16_TOP)[0, 0], torch.tensor(-128.0 * 32)
    )


def head_case(rows: int, outputs: int = OUTPUTS) -> tuple:
    """A head's Q8_0 blocks, the float32 weight they dequantize to, and rows of hidden
    states for it."""
    k = 256
    block = int8_group_weight(k, 32, 3, outputs)
    return block, dense(block), torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))


@pytest.mark.parametrize("rows", (1, 4, BLOCKS_ROW_KERNEL_ROWS, BLOCKS_ROW_KERNEL_ROWS + 1))
def test_a_checkpoint_head_rounds_to_int16_only_in_its_row_kernel(rows):
    block, weight, x = head_case(rows)
    got = NativeHead(weight, bf16=False, block=block, int16=True)(x)
    floats = NativeHead(weight, bf16=False, block=block)(x)
    if rows <= BLOCKS_ROW_KERNEL_ROWS:
        assert torch.equal(got, call_int8(x, block.q, block.scale, 32, INT16_TOP))
        assert_within_rounding(got, x, weight)
    else:
        assert torch.equal(got, floats)  # the panel: float32 activations, whatever asked


@pytest.mark.parametrize("tokens", (1, 5, BLOCKS_ROW_KERNEL_ROWS + 3))
def test_a_layer_with_int16_blocks_stays_near_its_float32_halves(tokens):
    built, blocks = layer_with_blocks()
    int16 = NativeHalves.of(built, blocks=blocks, blocks_int16=True)
    floats = NativeHalves.of(built, blocks=blocks)
    x = torch.randn(tokens, built.input_layernorm.weight.shape[0])
    cos, sin = rotary(tokens, built.self_attn.head_dim)
    got, want = int16.inputs(x, None, cos, sin), floats.inputs(x, None, cos, sin)
    # q, k and v come from the projections; the residual stream is x either way.
    for a, b in zip(got[:3], want[:3], strict=True):
        if tokens > BLOCKS_ROW_KERNEL_ROWS:
            assert torch.equal(a, b)
        else:
            assert not torch.equal(a, b)
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
