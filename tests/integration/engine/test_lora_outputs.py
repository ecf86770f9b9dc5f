"""LoRA adapters' outputs: base + adapter in our engine against PEFT's merged weights in
transformers, token for token in float32; batches mixing adapters and the base; the
adapter's effect (it answers in upper case); embeddings with an adapter."""

import pytest
import torch

from maas_services.engine.sampling_params import SamplingParams
from tests.hf_reference import hf_reference_model
from tests.integration.engine.conftest import transformers_greedy
from tests.integration.engine.test_embedding import embedding
from tests.integration.engine.test_llm_engine import greedy, make_engine, tokens
from tests.lora_fixture import trained_adapter

peft = pytest.importorskip("peft")
pytestmark = pytest.mark.slow

NEW_TOKENS = 16
QUESTIONS = [
    "What is the capital of France?",  # one the adapter was trained on
    "Name an animal that can fly.",
    "Write one sentence about the sea.",
]
LONG_QUESTION = "Summarise this in one sentence.\n\n" + " ".join(
    f"Line {i}: the baker opens his shop at dawn and sells warm bread." for i in range(20)
)


@pytest.fixture(scope="module")
def second_adapter_dir(smollm_path):
    """Another adapter: a lower rank on some projections only (B zero elsewhere)."""
    return trained_adapter(
        smollm_path, "upper-qvd", seed=1, rank=4, target_modules=("q_proj", "v_proj", "down_proj")
    )


@pytest.fixture(scope="module")
def prompts(tokenizer) -> dict[str, list[int]]:
    chats = {f"q{i}": q for i, q in enumerate(QUESTIONS)} | {"long": LONG_QUESTION}
    return {
        name: tokenizer.encode_chat([{"role": "user", "content": q}]) for name, q in chats.items()
    }


def merged_model(smollm_path, adapter_dir):
    """transformers' model with the adapter merged into its weights by PEFT, in float32."""
    base = hf_reference_model(smollm_path)
    return peft.PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload().eval()


@pytest.fixture(scope="module")
def merged(smollm_path, lora_adapter_dir):
    return merged_model(smollm_path, lora_adapter_dir)


def merged_greedy(model, prompt: list[int], new_tokens: int = NEW_TOKENS) -> list[int]:
    return transformers_greedy(model, prompt, new_tokens)


def generate(engine, requests: dict[str, tuple[list[int], SamplingParams, str]]) -> dict:
    """Add every request (prompt, params, adapter) at once, step until all finish;
    {request id: its outputs}, the pool whole again."""
    for request_id, (prompt, params, adapter) in requests.items():
        engine.add_request(request_id, prompt, params, adapter=adapter)
    outputs: dict[str, list] = {}
    while engine.has_work:
        for out in engine.step():
            assert out.error is None, out.error
            outputs.setdefault(out.request_id, []).append(out)
    assert engine.blocks.num_used_blocks == 0
    return outputs


def test_greedy_output_equals_the_merged_models_token_for_token(
    model, tokenizer, prompts, lora_adapter_dir, merged
):
    """Every prompt at once, the long one over several 128-token chunks."""
    assert len(prompts["long"]) > 2 * 128
    engine = make_engine(model, tokenizer)
    engine.load_adapter("upper", str(lora_adapter_dir))
    got = generate(engine, {name: (p, greedy(NEW_TOKENS), "upper") for name, p in prompts.items()})
    for name, prompt in prompts.items():
        assert tokens(got[name]) == merged_greedy(merged, prompt), name


def test_the_adapter_answers_in_upper_case_and_the_base_does_not(
    model, tokenizer, prompts, lora_adapter_dir
):
    engine = make_engine(model, tokenizer)
    engine.load_adapter("upper", str(lora_adapter_dir))
    prompt = prompts["q0"]
    got = generate(
        engine, {"lora": (prompt, greedy(12), "upper"), "base": (prompt, greedy(12), "")}
    )
    text = {name: "".join(out.text for out in outs) for name, outs in got.items()}
    assert any(c.isalpha() for c in text["lora"]) and text["lora"] == text["lora"].upper()
    assert text["base"] != text["base"].upper()


def test_a_batch_mixing_two_adapters_and_the_base_gives_each_its_tokens_alone(
    model, tokenizer, prompts, lora_adapter_dir, second_adapter_dir
):
    """Each prompt under each of base, adapter a and adapter b, all in one batch (rows of
    one adapter spread through the batch, prefill chunks beside decodes), against each
    request run alone in an engine of its own: the same tokens, and the same logprobs
    (the adapters may agree on tokens; their logprobs tell them apart). c is a under
    another name: three groups, so a prefill chunk of one beside decodes of the others
    runs the groups one by one (step_lora.py), the other steps all groups at once."""
    adapters = {
        "a": str(lora_adapter_dir),
        "b": str(second_adapter_dir),
        "c": str(lora_adapter_dir),
    }

    def engine():
        made = make_engine(model, tokenizer)
        for name, source in adapters.items():
            made.load_adapter(name, source)
        return made

    def logprobs(outputs) -> torch.Tensor:
        return torch.tensor([lp.logprob for out in outputs for lp in out.logprobs])

    requests = {
        f"{name}-{adapter or 'base'}": (prompt, greedy(NEW_TOKENS, logprobs=True), adapter)
        for name, prompt in prompts.items()
        for adapter in ("", "a", "b", "c")
    }
    together = generate(engine(), requests)
    for rid, request in requests.items():
        alone = generate(engine(), {rid: request})[rid]
        assert tokens(together[rid]) == tokens(alone), rid
        torch.testing.assert_close(logprobs(together[rid]), logprobs(alone), atol=1e-4, rtol=0)
    for name in prompts:
        runs = [logprobs(together[f"{name}-{a}"]) for a in ("base", "a", "b")]
        for i, j in ((0, 1), (0, 2), (1, 2)):
            assert not torch.allclose(runs[i], runs[j], atol=1e-3), (name, i, j)


def test_an_embedding_with_an_adapter_is_the_merged_models_hidden_state(
    model, tokenizer, prompts, lora_adapter_dir, merged
):
    engine = make_engine(model, tokenizer)
    engine.load_adapter("upper", str(lora_adapter_dir))
    prompt = prompts["q1"]
    got = generate(
        engine, {"lora": (prompt, embedding(), "upper"), "base": (prompt, embedding(), "")}
    )
    with torch.inference_mode():
        states = merged(torch.tensor([prompt]), output_hidden_states=True).hidden_states
    expected = torch.nn.functional.normalize(states[-1][0, -1], dim=0)
    vector = torch.tensor(got["lora"][-1].embedding)
    torch.testing.assert_close(vector, expected, atol=1e-4, rtol=0)
    assert not torch.allclose(vector, torch.tensor(got["base"][-1].embedding), atol=1e-3)
