"""--wide-gemm bf16 on the real model: the engine's wide steps in bf16 still compute SmolLM2
within the known-answer check, and greedy decoding in wide batches stays sane. Skipped
where the library has no bf16 panel GEMM (a CPU without AVX512-BF16)."""

import pytest

from maas_services.common.machine_profile import machine_profile
from maas_services.engine.known_answer import judge, known_token_ids, score_native
from maas_services.engine.known_answer_reference import reference
from maas_services.engine.machine_defaults import resolve
from maas_services.engine.model_runner import choose_path
from maas_services.engine.native_layers import Native, wide_bf16_kernel
from maas_services.engine.offline import generate, offline_engine
from maas_services.engine.sampling_params import SamplingParams
from maas_services.engine.settings import EngineSettings

pytestmark = pytest.mark.skipif(
    not wide_bf16_kernel(), reason="the library has no bf16 panel GEMM on this CPU"
)


@pytest.fixture(scope="module")
def bf16_path(model):
    return choose_path(model[0], compiled=False, native=True, wide_gemm="bf16")


def test_the_engine_takes_the_bf16_panel_where_asked_and_auto_resolves_to_a_choice(bf16_path):
    assert bf16_path.describe()["wide_gemm"] == "bf16"
    assert bf16_path.describe()["wide_gemm_kernel"] == wide_bf16_kernel()
    resolved = resolve(EngineSettings(), machine_profile(), on_cuda=False, environ={})
    assert resolved.settings.wide_gemm in ("float32", "bf16")
    assert resolved.choices["wide_gemm"].why


def test_bf16_wide_steps_pass_the_known_answer_check(model, tokenizer, smollm_path, bf16_path):
    texts = known_token_ids(tokenizer)
    float32_reference = reference("cache", smollm_path)
    float32 = score_native(model[0], texts, path=Native(model[0], "float32", wide_gemm="float32"))
    bf16 = score_native(model[0], texts, path=bf16_path)
    verdict = judge(bf16.perplexity, float32_reference, EngineSettings().known_answer_tolerance)
    assert verdict.passed, verdict.failure
    # The prefills (tens of rows) did run in bf16: float32's panel gives the reference.
    assert bf16.perplexity != float32.perplexity
    assert float32.perplexity == pytest.approx(float32_reference, rel=1e-4)


def test_greedy_batches_decode_in_bf16_and_a_rows_place_in_a_tile_changes_nothing(
    model, tokenizer, bf16_path
):
    llama, config = model
    engine = offline_engine(llama, config, tokenizer, max_num_seqs=24, max_model_len=256)
    engine.runner.path = bf16_path
    question = tokenizer.encode_chat(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    others = [tokenizer.encode(f"Write a sentence about the number {i}.") for i in range(8)]
    # 24 rows a decode step: two blocks of 16 and 8 activation rows, the same prompt in each.
    prompts = [question] * 16 + others
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outputs = generate(engine, prompts, params)
    assert all(out == outputs[0] for out in outputs[:16])
    assert "Paris" in tokenizer.decode(outputs[0])
