"""int4 layers straight from a GGUF file's Q4_0/Q4_1 blocks, on a tiny file written here."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from maas_kernels.quant_int4_ref import dequantize_int4
from maas_services.engine.loader import load_model
from maas_services.engine.model_config import ModelConfig
from maas_services.engine.quantization import file_blocks as file_blocks_module
from maas_services.engine.quantization import gguf_blocks as gguf_blocks_module
from maas_services.engine.quantization.config import QUANTIZED_MODULES, QuantizationConfig
from maas_services.engine.quantization.gguf_blocks import _from_blocks, read_int4_blocks
from maas_services.engine.quantization.linear import QuantizedLinear
from maas_services.engine.scoring import window_logits
from tests.unit.engine.test_model import TOKENS

Q4_0, Q4_1, Q8_0 = GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0


@pytest.mark.parametrize("kind", [Q4_0, Q4_1])
def test_blocks_repack_to_exactly_the_values_gguf_dequantizes_to(kind):
    weight = np.random.default_rng(0).standard_normal((6, 96)).astype(np.float32)
    blocks = quantize(weight, kind)
    int4 = _from_blocks(blocks, kind)
    assert int4.group_size == 32 and int4.shape == (6, 96)
    ours = dequantize_int4(int4.packed, int4.scales, int4.mins, 32)
    assert torch.equal(ours, torch.from_numpy(dequantize(blocks, kind)))


def write_tiny_gguf(path, config: ModelConfig, types: dict[str, GGMLQuantizationType]) -> None:
    """A llama GGUF of config's shape, random weights; each linear in types[name], else Q4_1."""
    rng = np.random.default_rng(0)
    writer = GGUFWriter(path, "llama")
    writer.add_block_count(config.num_layers)
    writer.add_context_length(config.max_model_len)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_vocab_size(config.vocab_size)

    def add(name: str, shape: tuple[int, ...], kind=GGMLQuantizationType.F32) -> None:
        values = (0.3 * rng.standard_normal(shape)).astype(np.float32)
        if kind == GGMLQuantizationType.F32:
            writer.add_tensor(name, values)
        else:
            writer.add_tensor(name, quantize(values, kind), raw_dtype=kind)

    hidden, inter = config.hidden_size, config.intermediate_size
    q_rows, kv_rows = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    add("token_embd.weight", (config.vocab_size, hidden))
    add("output_norm.weight", (hidden,))
    for i in range(config.num_layers):
        shapes = {
            "attn_q": (q_rows, hidden),
            "attn_k": (kv_rows, hidden),
            "attn_v": (kv_rows, hidden),
            "attn_output": (hidden, q_rows),
            "ffn_gate": (inter, hidden),
            "ffn_up": (inter, hidden),
            "ffn_down": (hidden, inter),
        }
        for part, shape in shapes.items():
            name = f"blk.{i}.{part}.weight"
            add(name, shape, types.get(name, Q4_1))
        add(f"blk.{i}.attn_norm.weight", (hidden,))
        add(f"blk.{i}.ffn_norm.weight", (hidden,))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture
def tiny_gguf(tmp_path, tiny_config):
    path = tmp_path / "tiny.gguf"
    # Layer 1's v projection in Q8_0, as mixed quantizations store some tensors.
    write_tiny_gguf(path, tiny_config, {"blk.1.attn_v.weight": Q8_0})
    return path


def test_read_blocks_fuses_q4_parts_and_skips_a_projection_with_another_type(
    tiny_gguf, tiny_config
):
    float_model, _ = load_model(tiny_gguf, torch.float32, progress=False)
    blocks = read_int4_blocks(
        tiny_gguf, tiny_config, float_model.packed_modules_mapping, QUANTIZED_MODULES
    )
    expected = {
        f"model.layers.{i}.{m}"
        for i in (0, 1)
        for m in ("self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
    }
    assert set(blocks) == expected | {"model.layers.0.self_attn.qkv_proj"}
    for name, int4 in blocks.items():
        # Fused in shard order and with q/k rows un-permuted: the loader's float weights exactly.
        restored = dequantize_int4(int4.packed, int4.scales, int4.mins, 32)
        assert torch.equal(restored, float_model.get_submodule(name).weight)


def test_int4_group_32_from_the_file_runs_the_files_own_weights(tmp_path, tiny_config):
    path = tmp_path / "all-q4_1.gguf"
    write_tiny_gguf(path, tiny_config, {})
    float_model, _ = load_model(path, torch.float32, progress=False)
    # The float head: the layers alone hold the file's weights exactly.
    quantization = QuantizationConfig("int4", 32, quantize_head=False)
    quantized, _ = load_model(path, torch.float32, progress=False, quantization=quantization)
    assert sum(isinstance(m, QuantizedLinear) for m in quantized.modules()) == 4 * 2
    with torch.inference_mode():
        torch.testing.assert_close(
            window_logits(quantized, TOKENS, "cpu"),
            window_logits(float_model, TOKENS, "cpu"),
            atol=1e-5,
            rtol=1e-5,
        )


def test_a_second_int4_engine_of_the_file_takes_its_blocks_from_the_model_cache(
    tmp_path, tiny_config, monkeypatch
):
    monkeypatch.setenv("MAAS_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "all-q4_1.gguf"
    write_tiny_gguf(path, tiny_config, {})
    quantization = QuantizationConfig("int4", 32, quantize_head=False)
    first, _ = load_model(path, torch.float32, progress=False, quantization=quantization)

    def no_parse(path):
        raise AssertionError("parsed the GGUF's blocks again")

    for module in (file_blocks_module, gguf_blocks_module):
        monkeypatch.setattr(module, "GGUFReader", no_parse)
    second, _ = load_model(path, torch.float32, progress=False, quantization=quantization)
    layers = [m for m in second.modules() if isinstance(m, QuantizedLinear)]
    assert len(layers) == 4 * 2 and all(m.from_file for m in layers)
    with torch.inference_mode():
        assert torch.equal(
            window_logits(second, TOKENS, "cpu"), window_logits(first, TOKENS, "cpu")
        )
