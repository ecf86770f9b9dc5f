import dataclasses

import pytest
import torch

from services.engine.gguf_loader import _unpermute_rotary_rows
from services.engine.kv_cache import KVCache
from services.engine.model import LlamaForCausalLM

TOKENS = [3, 17, 42, 8, 8, 60, 5, 21, 33, 9]


def run(model, cache: KVCache, ids: list[int]) -> torch.Tensor:
    """Logits at every new position."""
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(ids), [cache], [len(ids)]))


def new_cache(model, max_len: int = 16) -> KVCache:
    return KVCache.allocate(model.config, max_len, torch.float32, "cpu")


def test_decoding_one_token_at_a_time_matches_one_pass(tiny_model):
    full = run(tiny_model, new_cache(tiny_model), TOKENS)
    cache = new_cache(tiny_model)
    stepwise = torch.cat([run(tiny_model, cache, [t]) for t in TOKENS])
    torch.testing.assert_close(stepwise, full, atol=1e-5, rtol=1e-5)
    assert cache.length == len(TOKENS)


def test_prefill_in_chunks_matches_one_pass(tiny_model):
    full = run(tiny_model, new_cache(tiny_model), TOKENS)
    cache = new_cache(tiny_model)
    chunked = torch.cat([run(tiny_model, cache, TOKENS[:3]), run(tiny_model, cache, TOKENS[3:])])
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=1e-5)


def test_a_mixed_batch_matches_each_sequence_alone(tiny_model):
    a, b = TOKENS[:6], TOKENS[4:]
    expected_a = run(tiny_model, new_cache(tiny_model), a)[-1]
    expected_b = run(tiny_model, new_cache(tiny_model), b)[-1]
    expected_c = run(tiny_model, new_cache(tiny_model), [7])[-1]

    cache_a, cache_b, cache_c = new_cache(tiny_model), new_cache(tiny_model), new_cache(tiny_model)
    run(tiny_model, cache_a, a[:-1])
    run(tiny_model, cache_b, b[:-2])
    # a and b decode, c prefills, all in one call.
    ids = torch.tensor([a[-1], *b[-2:], 7])
    with torch.inference_mode():
        hidden = tiny_model(ids, [cache_a, cache_b, cache_c], [1, 2, 1])
        logits = tiny_model.compute_logits(hidden[[0, 2, 3]])
    torch.testing.assert_close(
        logits, torch.stack([expected_a, expected_b, expected_c]), atol=1e-5, rtol=1e-5
    )
    assert (cache_a.length, cache_b.length, cache_c.length) == (len(a), len(b), 1)


def test_an_overfull_cache_is_refused(tiny_model):
    cache = new_cache(tiny_model, max_len=4)
    run(tiny_model, cache, TOKENS[:3])
    with pytest.raises(ValueError, match="KV cache"):
        run(tiny_model, cache, TOKENS[3:5])


def test_attention_bias_variant_runs_and_uses_its_bias(tiny_config):
    config = dataclasses.replace(
        tiny_config, architecture="qwen2", attention_bias=True, tie_word_embeddings=False
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    for param in model.parameters():
        torch.nn.init.normal_(param, std=0.3)
    before = run(model, new_cache(model), TOKENS)
    model.model.layers[0].self_attn.qkv_proj.bias.data += 1
    assert before.shape == (len(TOKENS), config.vocab_size)
    assert not torch.allclose(run(model, new_cache(model), TOKENS), before)


@pytest.mark.parametrize("heads", [1, 3, 9])
def test_unpermute_inverts_llama_cpp_rotary_permutation(heads):
    rows, cols = heads * 64, 576
    weight = torch.randn(rows, cols)
    # llama.cpp convert_hf_to_gguf.py's permute, as the file stores it.
    permuted = weight.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)
    assert torch.equal(_unpermute_rotary_rows(permuted, heads), weight)
