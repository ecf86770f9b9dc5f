"""--wide-gemm bf16 on the real model: the engine's steps in bf16 still compute SmolLM2
within the known-answer check, greedy decoding in wide batches stays sane, and a request
answers alone as it does batched. Skipped where the library has no bf16 panel GEMM (a CPU
without AVX512-BF16)."""

import pytest
import torch

from maas_services.common.machine_profile import machine_profile
from maas_services.engine.known_answer import judge, known_token_ids, score_native
from maas_services.engine.known_answer_reference import reference
from maas_services.engine.machine_defaults import resolve
from maas_services.engine.model_runner import choose_path
from maas_services.engine.native_layers import Native, wide_bf16_kernel, wide_int8_kernel
from maas_services.engine.offline import generate, offline_engine
from maas_services.engine.quantization.cpu_kernel import MAX_ROW_KERNEL_ROWS
from maas_services.engine.sampling_params import SamplingParams
from maas_services.engine.settings import EngineSettings
from tests.unit.kernels.test_bf16_panel import needs_bf16_panel

pytestmark = needs_bf16_panel


@pytest.fixture(scope="module")
def bf16_path(model):
    return choose_path(model[0], compiled=False, native=True, wide_gemm="bf16")


def test_the_engine_takes_the_bf16_panel_where_asked_and_auto_resolves_to_a_choice(bf16_path):
    assert bf16_path.describe()["wide_gemm"] == "bf16"
    assert bf16_path.describe()["wide_gemm_kernel"] == wide_bf16_kernel()
    resolved = resolve(EngineSettings(), machine_profile(), on_cuda=False, environ={})
    assert resolved.settings.wide_gemm in ("float32", "bf16")
    assert resolved.choices["wide_gemm"].why


def test_int8_without_the_checkpoints_blocks_says_it_computes_in_bf16(model):
    # A model without blocks (a folder) has nothing int8 could compute from: its steps
    # are bf16's, and engine_ready's fields say that, not the setting.
    path = choose_path(model[0], compiled=False, native=True, wide_gemm="int8")
    described = path.describe()
    assert described["wide_gemm"] == "bf16"
    assert described["wide_gemm_kernel"].startswith(wide_bf16_kernel())
    assert "no checkpoint blocks" in described["wide_gemm_kernel"] or not wide_int8_kernel()
    assert described["kernel_weights"] == "float32"


def test_the_bf16_head_is_within_bf16_rounding_at_every_width(model, bf16_path):
    """Logits through the head's bf16 copy (native_layers.NativeHead): within the derived
    bound of float32's (test_bf16_panel.py's), not equal to them; a narrow step's rows
    are the same rows' of a wide step (bf16_rows). The copies are counted (the KV budget
    reads extra_bytes)."""
    llama = model[0]
    torch.manual_seed(0)
    hidden = torch.randn(24, llama.config.hidden_size)
    weight = llama.model.embed_tokens.weight
    exact = hidden.double() @ weight.double().T
    wide = bf16_path.logits(llama, hidden)
    k = weight.shape[1]
    bound = (2**-8 + 2**-18 + 2 * k * 2**-24) * (hidden.abs().double() @ weight.abs().double().T)
    assert ((wide.double() - exact).abs() <= bound).all()
    assert not torch.equal(wide, llama.compute_logits(hidden))
    if wide_bf16_kernel() != "amx":  # AMX tiles sum in their own order (bf16.h)
        for rows in range(1, MAX_ROW_KERNEL_ROWS + 1):
            assert torch.equal(bf16_path.logits(llama, hidden[:rows]), wide[:rows])
    copies = sum(p.numel() * 2 for name, p in llama.named_parameters() if "proj" in name)
    assert bf16_path.extra_bytes == copies + weight.numel() * 2
    assert Native(llama, "float32", wide_gemm="float32").extra_bytes == 0


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
    # Alone, its steps narrow (bf16_rows), the question answers as in a step of 24 (not
    # promised with AMX tiles, which sum in their own order: bf16.h).
    if wide_bf16_kernel() != "amx":
        assert generate(engine, [question], params)[0] == outputs[0]
