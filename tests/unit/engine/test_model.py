import dataclasses

import pytest
import torch

from maas_services.engine.attention_metadata import AttentionMetadata
from maas_services.engine.dense_forward import dense_logits
from maas_services.engine.gguf_loader import _unpermute_rotary_rows
from maas_services.engine.kv_cache import PagedKVCache
from maas_services.engine.model import LlamaForCausalLM

TOKENS = [3, 17, 42, 8, 8, 60, 5, 21, 33, 9]
BLOCK_SIZE = 4


def paged_logits(model: LlamaForCausalLM, ids: list[int]) -> torch.Tensor:
    """Logits at every position of one prompt run in one forward over a fresh pool."""
    blocks = -(-len(ids) // BLOCK_SIZE)
    pool = PagedKVCache.allocate(model.config, blocks + 1, BLOCK_SIZE, torch.float32, "cpu")
    positions = torch.arange(len(ids))
    # Blocks in reverse order, so that nothing depends on a table being contiguous.
    table = list(range(blocks, 0, -1))
    meta = AttentionMetadata.build(positions, [len(ids)], [len(ids)], [table], BLOCK_SIZE, "cpu")
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(ids), positions, pool, meta))


def test_a_paged_forward_matches_a_dense_one_at_every_position(tiny_model):
    torch.testing.assert_close(
        paged_logits(tiny_model, TOKENS), dense_logits(tiny_model, TOKENS), atol=1e-5, rtol=1e-5
    )


def test_attention_bias_variant_runs_and_uses_its_bias(tiny_config):
    config = dataclasses.replace(
        tiny_config, architecture="qwen2", attention_bias=True, tie_word_embeddings=False
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    for param in model.parameters():
        torch.nn.init.normal_(param, std=0.3)
    before = paged_logits(model, TOKENS)
    torch.testing.assert_close(before, dense_logits(model, TOKENS), atol=1e-5, rtol=1e-5)
    model.model.layers[0].self_attn.qkv_proj.bias.data += 1
    assert before.shape == (len(TOKENS), config.vocab_size)
    assert not torch.allclose(paged_logits(model, TOKENS), before)


@pytest.mark.parametrize("heads", [1, 3, 9])
def test_unpermute_inverts_llama_cpp_rotary_permutation(heads):
    rows, cols = heads * 64, 576
    weight = torch.randn(rows, cols)
    # llama.cpp convert_hf_to_gguf.py's permute, as the file stores it.
    permuted = weight.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)
    assert torch.equal(_unpermute_rotary_rows(permuted, heads), weight)
