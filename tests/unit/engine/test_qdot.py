"""native/qdot.cpp: int8 and int4 weights against activations rounded to int8 per block of 32
(or to int16: a NativeWeight's integer16, --kernel-activations int16).

Against a float64 twin of the same arithmetic (tight: only float32 sums differ), and
against dequantize + matmul on the float activations (loose: each activation moves by
at most half its block's step, amax / 254 (int16: amax / 65534), which bounds the error
of every output).
"""

import copy
import ctypes

import pytest
import torch

from maas_kernels.native import bindings
from maas_kernels.quant_int4_ref import dequantize_int4, quantize_int4, unpack_int4
from maas_kernels.quant_int8_ref import dequantize_int8, quantize_int8
from maas_services.common.settings import parse_settings
from maas_services.engine import native_layers
from maas_services.engine.quantization import cpu_kernel
from maas_services.engine.quantization.config import QuantizationConfig
from maas_services.engine.quantization.int4 import Int4Linear, Int4Weight
from maas_services.engine.quantization.int8 import Int8Linear, Int8Weight
from maas_services.engine.quantization.linear import QuantizedLinear
from maas_services.engine.quantization.quantize import quantize_model
from maas_services.engine.settings import EngineSettings
from tests.unit.engine.test_native_layers import PROJECTIONS, layer, relative_error

needs_kernels = pytest.mark.skipif(
    bindings.library() is None, reason="no native library (not AVX2, or no compiler)"
)

BLOCK = 32
# Up to cpu_kernel.MAX_INTEGER_ROW_KERNEL_ROWS, in chunks of 4 and a remainder.
ROWS = [1, 2, 3, 4, 5, 8]
# None a multiple of 256 (a kernel unrolled that far would read past the row).
INT8_INPUTS = [96, 160, 576, 1536]
INT4_CASES = [(32, 96), (32, 576), (64, 576), (64, 1536), (128, 384), (128, 640)]
OUTPUTS = 37
# float32 sums in the kernel's order against float64: relative to the output's scale.
TIGHT = 1e-5


# The largest level of each rounding: int8's, int16's.
INT8_TOP, INT16_TOP = 127, 32767


def quantized_activations(x: torch.Tensor, top: int = INT8_TOP) -> tuple:
    """x [M, K] -> levels [M, K/32, 32] in -top..top and scales [M, K/32], as qdot.cpp
    rounds them: in float32, scale amax / top, half to even."""
    blocks = x.reshape(x.shape[0], -1, BLOCK)
    scale = blocks.abs().amax(-1) / top
    inverse = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
    return torch.round(blocks * inverse[..., None]), scale


def int8_reference(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, group: int = 0, top: int = INT8_TOP
) -> torch.Tensor:
    """scale: a row's [N] (group 0) or a group's [N, K / group]."""
    levels, d = (t.double() for t in quantized_activations(x, top))
    w = q.double().reshape(q.shape[0], -1, BLOCK)
    per_block = torch.einsum("mbi,nbi->mnb", levels, w)  # exact integers
    blocks = torch.arange(w.shape[1])
    weight_scale = scale.double()[:, blocks * BLOCK // group] if group else scale.double()[:, None]
    return (per_block * d[:, None, :] * weight_scale).sum(-1)


def int8_group_weight(k: int, group: int, seed: int = 0, outputs: int = OUTPUTS) -> Int8Weight:
    """Levels in -127..127 and a scale per group, as a GGUF file's Q8_0 blocks (group 32)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (outputs, k), generator=g, dtype=torch.int8)
    return Int8Weight(q, torch.rand(outputs, k // group, generator=g) * 0.01 + 1e-4, group)


def int4_reference(x, packed, scales, mins, group, top: int = INT8_TOP) -> torch.Tensor:
    levels, d = (t.double() for t in quantized_activations(x, top))
    w = unpack_int4(packed).double().reshape(packed.shape[0], -1, BLOCK)
    per_block = torch.einsum("mbi,nbi->mnb", levels, w)
    group_of = torch.arange(w.shape[1]) * BLOCK // group
    s, m = scales.double()[:, group_of], mins.double()[:, group_of]
    block_sums = levels.sum(-1) * d  # [M, blocks]
    return (per_block * d[:, None, :] * s).sum(-1) + (block_sums[:, None, :] * m).sum(-1)


def rounding_bound(x: torch.Tensor, w: torch.Tensor, top: int = INT8_TOP) -> torch.Tensor:
    """Per output, the most that rounding the activations can move x @ w^T."""
    step = x.reshape(x.shape[0], -1, BLOCK).abs().amax(-1, keepdim=True) / (2 * top)
    return step.expand(-1, -1, BLOCK).reshape(x.shape).double() @ w.abs().double().T


def assert_tight(got: torch.Tensor, want: torch.Tensor) -> None:
    assert (got.double() - want).abs().max() <= TIGHT * want.abs().max()


def strided(rows: int, k: int, seed: int) -> torch.Tensor:
    """rows of k activations inside wider rows: a layer's slice of a fused output."""
    wide = torch.randn(rows, k + 40, generator=torch.Generator().manual_seed(seed))
    return wide[:, 8 : 8 + k]


def int8_weight(k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_int8(torch.randn(OUTPUTS, k, generator=torch.Generator().manual_seed(seed)))


def int4_weight(k: int, group: int, seed: int = 0) -> tuple:
    weight = torch.randn(OUTPUTS, k, generator=torch.Generator().manual_seed(seed))
    return quantize_int4(weight, group)


def call_int8(x, q, scale, group: int = 0, top: int = INT8_TOP) -> torch.Tensor:
    """The library on x as it lies in memory (row stride and all): its int8 entry, or with
    top INT16_TOP the engine's own, a NativeWeight whose integer16 asks for int16."""
    out = torch.empty(x.shape[0], q.shape[0])
    if top == INT16_TOP:
        arrays = (bindings.INT8, q.data_ptr(), scale.data_ptr(), 0, group)
        return through_weight(x, arrays, q.shape[0], q.shape[1])
    bindings.library().int8_matmul_q8(
        x.data_ptr(), x.shape[0], x.stride(0), q.data_ptr(), scale.data_ptr(), group, q.shape[0],
        q.shape[1], out.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return out


def call_int4(x, packed, scales, mins, group, top: int = INT8_TOP) -> torch.Tensor:
    n, k = packed.shape[0], packed.shape[1] * 2
    if top == INT16_TOP:
        arrays = (bindings.INT4, packed.data_ptr(), scales.data_ptr(), mins.data_ptr(), group)
        return through_weight(x, arrays, n, k)
    out = torch.empty(x.shape[0], n)
    bindings.library().int4_matmul_q8(
        x.data_ptr(), x.shape[0], x.stride(0), packed.data_ptr(), scales.data_ptr(),
        mins.data_ptr(), group, n, k, out.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return out


def through_weight(x: torch.Tensor, arrays: tuple, n: int, k: int) -> torch.Tensor:
    """x @ W^T through native_linear, W (format, data, scales, mins, group) rounding the
    activations to int16 for its integer row kernel up to 8 rows."""
    weight = bindings.Weight(*arrays, 0, n, k, cpu_kernel.MAX_INTEGER_ROW_KERNEL_ROWS)
    weight.integer16 = 1
    out = torch.empty(x.shape[0], n)
    bindings.library().weight_linear(
        ctypes.addressof(weight), x.data_ptr(), x.shape[0], x.stride(0), out.data_ptr(),
        cpu_kernel.MAX_ROW_KERNEL_ROWS, cpu_kernel.PANEL_BYTES, torch.get_num_threads(),
    )  # fmt: skip
    return out


@needs_kernels
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("k", INT8_INPUTS)
def test_int8_weights_equal_the_float64_twin_and_stay_in_the_rounding_bound(rows, k):
    q, scale = int8_weight(k)
    x = strided(rows, k, seed=rows)
    got = call_int8(x, q, scale)
    assert_tight(got, int8_reference(x, q, scale))
    w = dequantize_int8(q, scale)
    exact = x.double() @ w.double().T
    slack = TIGHT * exact.abs().max()
    assert ((got.double() - exact).abs() <= rounding_bound(x, w) + slack).all()
    # The module's path, on contiguous rows, is the same kernel.
    assert torch.equal(cpu_kernel.int8_matmul(x, q, scale, int8_activations=True), got)


@needs_kernels
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("group", "k"), [(32, 96), (32, 576), (32, 1536), (64, 576), (128, 640)])
def test_int8_weights_with_group_scales_equal_the_float64_twin(rows, group, k):
    weight = int8_group_weight(k, group, seed=k)
    x = strided(rows, k, seed=rows)
    out = call_int8(x, weight.q, weight.scale, group)
    assert_tight(out, int8_reference(x, weight.q, weight.scale, group))
    w = weight.dequantize()
    exact = x.double() @ w.double().T
    slack = TIGHT * exact.abs().max()
    assert ((out.double() - exact).abs() <= rounding_bound(x, w) + slack).all()
    # The module's path, on contiguous rows, is the same kernel.
    layer = Int8Linear(weight, None, torch.float32)
    layer.int8_activations = True
    assert torch.equal(layer(x), out)


@needs_kernels
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("group", "k"), INT4_CASES)
def test_int4_weights_equal_the_float64_twin_and_stay_in_the_rounding_bound(rows, group, k):
    packed, scales, mins = int4_weight(k, group)
    x = strided(rows, k, seed=rows)
    got = call_int4(x, packed, scales, mins, group)
    assert_tight(got, int4_reference(x, packed, scales, mins, group))
    # levels * scale * rounded x + min * sum(rounded x) is the weight times rounded x.
    w = dequantize_int4(packed, scales, mins, group)
    exact = x.double() @ w.double().T
    slack = TIGHT * exact.abs().max()
    assert ((got.double() - exact).abs() <= rounding_bound(x, w) + slack).all()
    args = (packed, scales, mins, group)
    assert torch.equal(cpu_kernel.int4_matmul(x, *args, int8_activations=True), got)


@needs_kernels
def test_extreme_weights_and_zero_blocks_do_not_saturate():
    # The format's extremes (-127..127, quant_int8_ref.py) against activations of 127 in
    # every pair: maddubs' largest int16 (2 * 127 * 127 < 2^15), of either sign.
    k = 96
    q = torch.full((3, k), -127, dtype=torch.int8)
    q[1] = 127
    q[2, ::2] = 0
    scale = torch.ones(3)
    x = torch.ones(2, k)
    x[1, :BLOCK] = 0  # an all-zero block: scale 0, no division by it
    got = call_int8(x, q, scale)
    assert_tight(got, int8_reference(x, q, scale))
    assert got[0, 0] == -127 * k and got[0, 1] == 127 * k


@needs_kernels
@pytest.mark.parametrize("k", [64, 96])  # pairs of blocks only; and a last block alone
def test_int4_pairs_of_extreme_blocks_do_not_saturate(k):
    # Level 15 everywhere against activations of 127: a pair's int16 sums (two maddubs
    # added, at most 2 * 2 * 15 * 127 < 2^15) at their largest, of either sign.
    packed = torch.full((2, k // 2), 0xFF, dtype=torch.uint8)
    scales, mins = torch.ones(2, k // BLOCK), torch.zeros(2, k // BLOCK)
    x = torch.ones(2, k)
    x[1] = -1
    got = call_int4(x, packed, scales, mins, BLOCK)
    assert_tight(got, int4_reference(x, packed, scales, mins, BLOCK))
    assert torch.allclose(got[:, 0], torch.tensor([15.0 * k, -15.0 * k]))


@needs_kernels
@pytest.mark.parametrize("top", [INT8_TOP, INT16_TOP])
@pytest.mark.parametrize("fmt", ["int8", "int4-g64"])
def test_two_threads_give_the_bits_one_does(fmt, top):
    k, x = 576, torch.randn(3, 576)
    if fmt == "int8":
        q, scale = quantize_int8(torch.randn(1000, k))
        run = lambda: call_int8(x, q, scale, top=top)  # noqa: E731
    else:
        weight = quantize_int4(torch.randn(1000, k), 64)
        run = lambda: call_int4(x, *weight, 64, top=top)  # noqa: E731
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(run())
    finally:
        torch.set_num_threads(before)
    assert torch.equal(*results)


def activations_on(module: torch.nn.Module) -> torch.nn.Module:
    module.int8_activations = True
    return module


@needs_kernels
@pytest.mark.parametrize("fmt", ["int8", "int4-g32", "int4-g64"])
@pytest.mark.parametrize("tokens", [1, 5, 9])
@torch.inference_mode()
def test_the_native_layer_halves_take_the_setting_as_the_modules_do(fmt, tokens):
    # The torch halves call each module's matmul (cpu_kernel); the native ones reach
    # native_linear with the flag in NativeWeight: both must round, or neither.
    built = layer(fmt, False)
    rounded = copy.deepcopy(built)
    for name in PROJECTIONS:
        activations_on(rounded.get_submodule(name))
    halves = native_layers.NativeHalves.of(rounded)
    torch.manual_seed(tokens)
    attended, residual = torch.randn(tokens, 6, 32), torch.randn(tokens, 192)
    reference = type(rounded).attention_outputs(rounded, attended, residual)
    ours = halves.outputs(attended, residual)
    for got, want in zip(ours, reference, strict=True):
        assert relative_error(got, want) <= 1e-5
    unrounded = native_layers.NativeHalves.of(built).outputs(attended, residual)[0]
    # Up to the row kernel's rows the setting arrived (rounded); above, the GEMM ignores it.
    rounds = tokens <= cpu_kernel.MAX_INTEGER_ROW_KERNEL_ROWS
    assert torch.equal(ours[0], unrounded) is not rounds


def test_quantize_model_sets_the_activations_on_every_quantized_linear(tiny_model):
    config = QuantizationConfig("int4", 32, activations="int8")
    model = quantize_model(copy.deepcopy(tiny_model), config, torch.float32)
    quantized = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    assert len(quantized) == 4 * len(model.model.layers) + 1  # and the head
    assert all(m.int8_activations for m in quantized)
    default = quantize_model(copy.deepcopy(tiny_model), QuantizationConfig("int8"), torch.float32)
    assert not any(m.int8_activations for m in default.modules() if isinstance(m, QuantizedLinear))


def test_the_engine_flag_picks_the_activations_and_rounds_them_by_default():
    assert parse_settings(EngineSettings, [], "engine").quantization_activations == "int8"
    flags = ["--quantization", "int8", "--quantization-activations", "float32"]
    assert parse_settings(EngineSettings, flags, "engine").quantization_activations == "float32"
    with pytest.raises(ValueError):
        parse_settings(EngineSettings, ["--quantization-activations", "int4"], "engine")
    with pytest.raises(ValueError, match="activations"):
        QuantizationConfig("int8", activations="int4")


@pytest.mark.usefixtures("without_a_compiler")
def test_without_a_compiler_the_setting_falls_back_to_dequantize_and_matmul():
    # No library: the modules keep the float activations of the torch path.
    assert bindings.library() is None
    weight = torch.randn(OUTPUTS, 96)
    x = torch.randn(2, 96)
    int8 = activations_on(Int8Linear(weight, None, torch.float32))
    int4 = activations_on(Int4Linear(Int4Weight.quantize(weight, 32), None, torch.float32))
    torch.testing.assert_close(int8(x), x @ dequantize_int8(int8.qweight, int8.scale).T)
    w4 = dequantize_int4(int4.packed, int4.scales, int4.mins, 32)
    torch.testing.assert_close(int4(x), x @ w4.T)
