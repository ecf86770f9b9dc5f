"""--kv-cache-dtype bf16 on the real model: a float32 engine over a bf16 KV pool still
computes SmolLM2 within the known-answer check, greedy decoding stays sane and a request
answers alone as it does batched; the pool holds twice the tokens in the same memory."""

import pytest
import torch

from maas_services.engine.known_answer import judge, known_token_ids, score_native
from maas_services.engine.known_answer_reference import reference
from maas_services.engine.kv_budget import num_blocks
from maas_services.engine.model_runner import choose_path
from maas_services.engine.native_layers import wide_bf16_kernel
from maas_services.engine.offline import generate, offline_engine
from maas_services.engine.sampling_params import SamplingParams
from maas_services.engine.settings import EngineSettings

WIDE_GEMMS = ["float32"] + (["bf16"] if wide_bf16_kernel() else [])


@pytest.mark.parametrize("wide_gemm", WIDE_GEMMS)
def test_a_bf16_pool_passes_the_known_answer_check(model, tokenizer, smollm_path, wide_gemm):
    llama = model[0]
    path = choose_path(llama, compiled=False, native=True, wide_gemm=wide_gemm)
    texts = known_token_ids(tokenizer)
    float32_reference = reference("cache", smollm_path)
    pooled = score_native(llama, texts, path=path, kv_dtype=torch.bfloat16)
    verdict = judge(pooled.perplexity, float32_reference, EngineSettings().known_answer_tolerance)
    assert verdict.passed, verdict.failure
    # The prefills did read their keys and values back rounded.
    assert pooled.perplexity != score_native(llama, texts, path=path).perplexity


def test_greedy_decoding_over_a_bf16_pool_answers_alike_alone_and_batched(model, tokenizer):
    llama, config = model
    engine = offline_engine(
        llama, config, tokenizer, max_num_seqs=12, max_model_len=256, kv_dtype=torch.bfloat16
    )
    assert engine.runner.kv_cache.k.dtype == torch.bfloat16
    assert engine.runner.model.dtype == torch.float32
    question = tokenizer.encode_chat(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    others = [tokenizer.encode(f"Write a sentence about the number {i}.") for i in range(11)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    batched = generate(engine, [question, *others], params)
    assert "Paris" in tokenizer.decode(batched[0])
    # Each decode attends alone over its own blocks (one thread, a fixed order): the
    # step's other rows change nothing in its attention.
    assert generate(engine, [question], params)[0] == batched[0]


def test_a_bf16_pool_holds_twice_the_blocks_of_a_float32_one(model):
    config = model[1]
    settings = EngineSettings()
    memory = 64 << 20
    full = num_blocks(settings, config, torch.float32, memory)
    assert num_blocks(settings, config, torch.bfloat16, memory) == 2 * full
