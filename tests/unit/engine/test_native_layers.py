"""The native layer halves (native/layer.cpp) against the torch halves they replace."""

import copy

import pytest
import torch

from maas_kernels.native import bindings
from maas_kernels.rotary_ref import rotary_cos_sin_reference
from maas_services.engine import native_attention, native_layers
from maas_services.engine.attention_metadata import AttentionMetadata
from maas_services.engine.kv_cache import PagedKVCache
from maas_services.engine.model import DecoderLayer, LlamaForCausalLM
from maas_services.engine.model_config import ModelConfig
from maas_services.engine.quantization.int4 import Int4Linear, Int4Weight
from maas_services.engine.quantization.int8 import Int8Linear

pytestmark = pytest.mark.skipif(
    bindings.library() is None, reason="no native library (not AVX2, or no compiler)"
)

PROJECTIONS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
FORMATS = ("float32", "int8", "int4-g32", "int4-g64")
TOKENS = (1, 3, 5, 64, 300)


def config(attention_bias: bool) -> ModelConfig:
    # SmolLM2's proportions shrunk: 3 query heads per kv head, an MLP wider than the stream.
    return ModelConfig(
        architecture="qwen2" if attention_bias else "llama",
        vocab_size=64,
        hidden_size=192,
        intermediate_size=512,
        num_layers=2,
        num_heads=6,
        num_kv_heads=2,
        head_dim=32,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_model_len=512,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
        attention_bias=attention_bias,
    )


def quantized(linear: torch.nn.Linear, fmt: str) -> torch.nn.Module:
    shards = getattr(linear, "shard_sizes", None)
    if fmt == "int8":
        return Int8Linear(linear.weight, linear.bias, torch.float32, shards)
    group = int(fmt.removeprefix("int4-g"))
    weight = Int4Weight.quantize(linear.weight, group)
    return Int4Linear(weight, linear.bias, torch.float32, shards)


def layer(fmt: str, attention_bias: bool) -> DecoderLayer:
    torch.manual_seed(0)
    built = DecoderLayer(config(attention_bias), 0).eval().requires_grad_(False)
    for name, param in built.named_parameters():
        torch.nn.init.normal_(param, mean=1.0 if "layernorm" in name else 0.0, std=0.1)
    if fmt != "float32":
        for name in PROJECTIONS:
            parent, _, child = name.rpartition(".")
            module = built.get_submodule(parent)
            setattr(module, child, quantized(getattr(module, child), fmt))
    return built


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return ((ours - reference).abs().max() / reference.abs().max()).item()


def rotary(tokens: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    positions = torch.randperm(400)[:tokens]
    return rotary_cos_sin_reference(positions, head_dim, 10000.0, torch.float32)


@pytest.fixture(
    scope="module",
    params=[(f, False) for f in FORMATS] + [("float32", True), ("int8", True)],
    ids=str,
)
def case(request) -> tuple[DecoderLayer, native_layers.NativeHalves]:
    built = layer(*request.param)
    halves = native_layers.NativeHalves.of(built)
    assert halves is not None
    return built, halves


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("first_layer", [True, False], ids=["no-residual", "residual"])
@torch.inference_mode()
def test_inputs_match_the_torch_half(case, tokens, first_layer):
    built, halves = case
    torch.manual_seed(tokens)
    x = torch.randn(tokens, 192)
    residual = None if first_layer else torch.randn(tokens, 192)
    cos, sin = rotary(tokens, 32)
    reference = DecoderLayer.attention_inputs(built, x, residual, cos, sin)
    ours = halves.inputs(x, residual, cos, sin)
    for got, want in zip(ours, reference, strict=True):
        assert got.shape == want.shape
        assert relative_error(got, want) <= 1e-5
    if first_layer:
        assert ours[3] is x


@pytest.mark.parametrize("tokens", TOKENS)
@torch.inference_mode()
def test_outputs_match_the_torch_half(case, tokens):
    built, halves = case
    torch.manual_seed(tokens)
    attended = torch.randn(tokens, 6, 32)
    residual = torch.randn(tokens, 192)
    reference = DecoderLayer.attention_outputs(built, attended, residual)
    ours = halves.outputs(attended, residual)
    for got, want in zip(ours, reference, strict=True):
        assert got.shape == want.shape
        assert relative_error(got, want) <= 1e-5


@pytest.mark.parametrize("tokens", [3, 300])
@pytest.mark.parametrize("fmt", ["float32", "int4-g32"])
@torch.inference_mode()
def test_two_threads_give_the_bits_one_does(fmt, tokens):
    halves = native_layers.NativeHalves.of(layer(fmt, True))
    torch.manual_seed(1)
    x, residual = torch.randn(tokens, 192), torch.randn(tokens, 192)
    cos, sin = rotary(tokens, 32)
    attended = torch.randn(tokens, 6, 32)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(
                (*halves.inputs(x, residual, cos, sin), *halves.outputs(attended, residual))
            )
    finally:
        torch.set_num_threads(before)
    for one, two in zip(*results, strict=True):
        assert torch.equal(one, two)


def model(attention_bias: bool = False) -> LlamaForCausalLM:
    torch.manual_seed(0)
    built = LlamaForCausalLM(config(attention_bias)).eval().requires_grad_(False)
    for param in built.parameters():
        torch.nn.init.normal_(param, std=0.1)
    return built


def native(built: LlamaForCausalLM, one_call: bool = True) -> native_layers.Native:
    return native_layers.Native(built, "a test", one_call)


def test_the_native_path_covers_every_layer_and_patches_none():
    built = model()
    assert native(built).native_layers == 2
    path = native(built)
    assert all(
        isinstance(path.halves(each), native_layers.NativeHalves) for each in built.model.layers
    )
    assert native(built).native_layers == 2  # idempotent
    assert all("attention_inputs" not in vars(each) for each in built.model.layers)


def unfit(built: LlamaForCausalLM) -> LlamaForCausalLM:
    """built with its first layer's norm in bfloat16: no native format holds that layer."""
    norm = built.model.layers[0].input_layernorm
    norm.weight = torch.nn.Parameter(norm.weight.detach().to(torch.bfloat16), False)
    return built


def test_the_torch_path_stays_where_the_halves_do_not_apply():
    bf16 = model().to(torch.bfloat16)
    assert native(bf16).native_layers == 0
    partly = unfit(model())
    path = native(partly)
    assert path.native_layers == 1  # the layer that does not fit keeps the torch halves
    assert path.halves(partly.model.layers[0]) is None


@torch.inference_mode()
def test_a_deep_copy_describes_its_own_weights():
    # quant_bench quantizes deep copies of one float model: the copy's path must read
    # the copy's (quantized) projections, not the original's.
    built = model()
    native(built)
    copied = copy.deepcopy(built)
    for name in PROJECTIONS:
        parent, _, child = name.rpartition(".")
        for each in copied.model.layers:
            module = each.get_submodule(parent)
            setattr(module, child, quantized(getattr(module, child), "int8"))
    copied_layer = copied.model.layers[1]
    x, residual = torch.randn(5, 192), torch.randn(5, 192)
    cos, sin = rotary(5, 32)
    ours = native(copied).attention_inputs(copied_layer, x, residual, cos, sin)
    reference = DecoderLayer.attention_inputs(copied_layer, x, residual, cos, sin)
    original = DecoderLayer.attention_inputs(built.model.layers[1], x, residual, cos, sin)
    assert relative_error(ours[0], reference[0]) <= 1e-5
    assert relative_error(ours[0], original[0]) > 1e-3


def quantized_model(fmt: str, attention_bias: bool = False) -> LlamaForCausalLM:
    built = model(attention_bias)
    if fmt != "float32":
        for each in built.model.layers:
            for name in PROJECTIONS:
                parent, _, child = name.rpartition(".")
                module = each.get_submodule(parent)
                setattr(module, child, quantized(getattr(module, child), fmt))
    return built


BLOCK = 16


def pool(built: LlamaForCausalLM, dtype: torch.dtype = torch.float32) -> PagedKVCache:
    # Random contents stand for the keys and values earlier steps wrote.
    cache = PagedKVCache.allocate(built.config, 12, BLOCK, dtype, "cpu")
    torch.manual_seed(2)
    cache.k.normal_()
    cache.v.normal_()
    return cache


def step_inputs(built: LlamaForCausalLM, query_lens: list[int], context_lens: list[int]):
    """Embeddings, cos, sin and metadata of a step over scattered blocks."""
    tables = [[3, 7, 1], [9], [4, 0]][: len(query_lens)]
    positions = torch.cat(
        [torch.arange(c - q, c) for q, c in zip(query_lens, context_lens, strict=True)]
    )
    meta = AttentionMetadata.build(positions, query_lens, context_lens, tables, BLOCK, "cpu")
    torch.manual_seed(3)
    ids = torch.randint(0, built.config.vocab_size, (positions.shape[0],))
    cos, sin = rotary_cos_sin_reference(positions, 32, 10000.0, torch.float32)
    return built.model.embed_tokens(ids), cos, sin, meta


def layer_loop(built, x, cos, sin, cache, meta):
    residual = None
    path = native(built)  # the per-layer calls, as a step the one call does not take runs
    for each in built.model.layers:
        x, residual = each(x, residual, cos, sin, cache, meta, path)
    return x, residual


@pytest.mark.parametrize("fmt", ["float32", "int8", "int4-g32"])
@pytest.mark.parametrize("attention_bias", [False, True], ids=["llama", "qwen2"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16], ids=["f32kv", "bf16kv"])
@torch.inference_mode()
def test_a_decode_step_in_one_call_is_the_layer_loop_bit_for_bit(
    fmt, attention_bias, threads, kv_dtype
):
    built = quantized_model(fmt, attention_bias)
    path = native(built)
    assert path.native_layers == 2
    x, cos, sin, meta = step_inputs(built, [1, 1, 1], [37, 5, 18])
    ours, theirs = pool(built, kv_dtype), pool(built, kv_dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        decoded = path.decode_step(built, x, cos, sin, ours, meta)
        looped = layer_loop(built, x, cos, sin, theirs, meta)
    finally:
        torch.set_num_threads(before)
    assert decoded is not None
    for got, want in zip(decoded, looped, strict=True):
        assert torch.equal(got, want)
    assert torch.equal(ours.k, theirs.k) and torch.equal(ours.v, theirs.v)


@torch.inference_mode()
def test_steps_the_one_call_does_not_take_run_the_layer_loop():
    built = model()
    path = native(built)
    cache = pool(built)
    x, cos, sin, meta = step_inputs(built, [1, 4], [37, 5])  # a prefill chunk after a decode
    assert path.decode_step(built, x, cos, sin, cache, meta) is None
    x, cos, sin, meta = step_inputs(built, [1], [37])
    with native_attention.torch_path():
        assert path.decode_step(built, x, cos, sin, cache, meta) is None
    assert native(built, one_call=False).decode_step(built, x, cos, sin, cache, meta) is None
    assert native(model()).decode_step(built, x, cos, sin, cache, meta) is None  # another model's
    partly = unfit(model())
    assert native(partly).decode_step(partly, x, cos, sin, cache, meta) is None


@torch.inference_mode()
def test_a_deep_copy_decodes_with_its_own_weights():
    built = model()
    copied = copy.deepcopy(built)
    for each in copied.model.layers:
        for name in PROJECTIONS:
            parent, _, child = name.rpartition(".")
            module = each.get_submodule(parent)
            setattr(module, child, quantized(getattr(module, child), "int8"))
    x, cos, sin, meta = step_inputs(copied, [1, 1], [37, 5])
    decoded = native(copied).decode_step(copied, x, cos, sin, pool(copied), meta)
    looped = layer_loop(copied, x, cos, sin, pool(copied), meta)
    original = native(built).decode_step(built, x, cos, sin, pool(built), meta)
    assert torch.equal(decoded[0], looped[0])
    assert not torch.equal(decoded[0], original[0])
