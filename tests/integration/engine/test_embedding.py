"""Embedding requests in the engine: a prefill with no decode, batched beside generation.

The vector is last-token pooling of the final-normed hidden states
(services/engine/embedding.py), checked against transformers, across the
three compute paths, through chunked prefill and the prefix cache.
"""

import pytest
import torch

from maas_services.engine.core.build import build_engine
from maas_services.engine.llm_engine import RequestRejected
from maas_services.engine.sampling_params import EmbeddingParams, SamplingParams
from maas_services.engine.settings import EngineSettings
from tests.integration.engine.test_llm_engine import greedy, make_engine, run, tokens

pytestmark = pytest.mark.slow

# (text, its paraphrase, an unrelated sentence)
TRIPLES = [
    (
        "The cat sat on the mat.",
        "A cat was sitting on the rug.",
        "Stock markets fell sharply today.",
    ),
    (
        "How do I bake bread at home?",
        "What is a simple recipe for homemade bread?",
        "The spacecraft entered orbit around Mars.",
    ),
    (
        "The weather is sunny and warm.",
        "It is a bright, hot day outside.",
        "He forgot his password.",
    ),
    (
        "She plays the violin beautifully.",
        "Her violin playing is lovely.",
        "The train was delayed.",
    ),
    (
        "Python is a programming language.",
        "Python is a language for writing software.",
        "Elephants live in large herds.",
    ),
]
LONG_TEXT = " ".join(
    f"Paragraph {i}: the river runs past the mill, and the miller counts his sacks of flour."
    for i in range(12)
)


def embedding(dimensions: int = 0) -> SamplingParams:
    return SamplingParams(max_tokens=0, embedding=EmbeddingParams(dimensions))


def encode(hf_tokenizer, text: str) -> list[int]:
    return hf_tokenizer(text)["input_ids"]


def vectors(engine, prompts: dict[str, list[int]], dimensions: int = 0) -> dict[str, torch.Tensor]:
    got = run(engine, {name: (prompt, embedding(dimensions)) for name, prompt in prompts.items()})
    return {name: torch.tensor(got[(name, 0)][-1].embedding) for name in prompts}


@pytest.fixture(scope="module")
def hf_vector(hf_model):
    """transformers' last-token final hidden state, L2-normalized."""

    def vector(prompt: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            states = hf_model(torch.tensor([prompt]), output_hidden_states=True).hidden_states
        return torch.nn.functional.normalize(states[-1][0, -1], dim=0)

    return vector


def test_one_output_with_the_vector_and_the_usage_of_a_prefill(model, tokenizer, hf_tokenizer):
    prompt = encode(hf_tokenizer, TRIPLES[0][0])
    got = run(make_engine(model, tokenizer), {"e": (prompt, embedding())})
    (out,) = got[("e", 0)]
    assert out.finish_reason == "stop" and out.error is None
    assert out.token_ids == [] and out.text == ""
    assert (out.prompt_tokens, out.completion_tokens) == (len(prompt), 0)
    assert out.computed_prompt_tokens == len(prompt)
    assert len(out.embedding) == model[1].hidden_size
    assert torch.tensor(out.embedding).norm().item() == pytest.approx(1.0, abs=1e-5)


def test_vectors_equal_transformers_when_batched_with_generation_and_chunked(
    model, tokenizer, hf_tokenizer, hf_vector, hf_greedy
):
    """Long and short embeddings in one batch with a generation request, the long
    prompt over several 128-token chunks: each vector as transformers computes it
    alone, and the generation as it runs alone."""
    prompts = {"long": encode(hf_tokenizer, LONG_TEXT)}
    prompts |= {f"t{i}": encode(hf_tokenizer, text) for i, (text, _, _) in enumerate(TRIPLES)}
    assert len(prompts["long"]) > 2 * 128
    engine = make_engine(model, tokenizer)
    generation = encode(hf_tokenizer, TRIPLES[1][2])
    requests = {name: (prompt, embedding()) for name, prompt in prompts.items()}
    got = run(engine, {"gen": (generation, greedy())} | requests)
    assert tokens(got[("gen", 0)]) == hf_greedy(generation, 20)
    for name, prompt in prompts.items():
        vector = torch.tensor(got[(name, 0)][-1].embedding)
        torch.testing.assert_close(vector, hf_vector(prompt), atol=1e-4, rtol=0)


# Not the compiled path: the vector is a row of the hidden states every path
# returns to ModelRunner.execute, which pools outside the path, and the compiled
# path's states are held to transformers by test_model_vs_transformers.py; its
# compile costs this file ~4 minutes for nothing more.
def test_the_torch_path_gives_the_vector_of_the_native_one(model, tokenizer, hf_tokenizer):
    prompts = {"long": encode(hf_tokenizer, LONG_TEXT), "short": encode(hf_tokenizer, "Hi")}
    native = vectors(make_engine(model, tokenizer), prompts)
    # The pool as the native engine's (float32): only the path differs.
    settings = EngineSettings(
        dtype="float32",
        kv_cache_dtype="model",
        device="cpu",
        kv_cache_memory=32 * 1024**2,
        max_num_batched_tokens=128,
    )
    engine = build_engine(settings.model_copy(update={"native_layers": False}))
    assert engine.runner.path.name == "eager"
    other = vectors(engine, prompts)
    for name in prompts:
        torch.testing.assert_close(other[name], native[name], atol=1e-4, rtol=0)


def test_paraphrases_are_closer_than_unrelated_sentences(model, tokenizer, hf_tokenizer):
    engine = make_engine(model, tokenizer)
    prompts = {
        f"{i}{role}": encode(hf_tokenizer, text)
        for i, triple in enumerate(TRIPLES)
        for role, text in zip("apu", triple, strict=True)
    }
    v = vectors(engine, prompts)
    for i in range(len(TRIPLES)):
        paraphrase = v[f"{i}a"] @ v[f"{i}p"]
        assert paraphrase > v[f"{i}a"] @ v[f"{i}u"], TRIPLES[i]
        assert paraphrase > v[f"{i}p"] @ v[f"{i}u"], TRIPLES[i]


def test_dimensions_keep_the_leading_ones_renormalized(model, tokenizer, hf_tokenizer):
    engine = make_engine(model, tokenizer)
    prompt = {"e": encode(hf_tokenizer, TRIPLES[2][0])}
    full = vectors(engine, prompt)["e"]
    short = vectors(engine, prompt, dimensions=64)["e"]
    assert short.shape == (64,)
    torch.testing.assert_close(short, full[:64] / full[:64].norm(), atol=1e-5, rtol=0)


def test_the_prefix_cache_serves_and_keeps_an_embeddings_blocks_per_tenant(
    model, tokenizer, hf_tokenizer
):
    engine = make_engine(model, tokenizer)
    prompt = encode(hf_tokenizer, LONG_TEXT)
    block = engine.config.block_size
    cacheable = (len(prompt) - 1) // block * block

    def once(request_id: str, tenant: str, params: SamplingParams):
        engine.add_request(request_id, prompt, params, tenant=tenant)
        outputs = []
        while engine.has_work:
            outputs += engine.step()
        return outputs[-1]

    first = once("first", "a", embedding())
    assert first.cached_prompt_tokens == 0
    again = once("again", "a", embedding())
    assert again.cached_prompt_tokens == cacheable
    torch.testing.assert_close(
        torch.tensor(again.embedding), torch.tensor(first.embedding), atol=1e-5, rtol=0
    )
    # Its blocks are any prompt's: a generation request of the same tenant hits them.
    assert once("generate", "a", greedy(max_tokens=1)).cached_prompt_tokens == cacheable
    # Another tenant's salt hashes them differently.
    assert once("other", "b", embedding()).cached_prompt_tokens == 0


@pytest.mark.parametrize(
    ("params", "refusal"),
    [
        (embedding(dimensions=-1), "embedding.dimensions must be in [1, 576]"),
        (embedding(dimensions=577), "embedding.dimensions must be in [1, 576]"),
        (SamplingParams(max_tokens=5, embedding=EmbeddingParams()), "max_tokens must be 0"),
        (SamplingParams(max_tokens=0, n=2, embedding=EmbeddingParams()), "n must be 1"),
        (
            SamplingParams(max_tokens=0, logprobs=True, embedding=EmbeddingParams()),
            "logprobs must be off",
        ),
    ],
)
def test_impossible_embeddings_are_refused_naming_the_field(model, tokenizer, params, refusal):
    with pytest.raises(RequestRejected, match=refusal.replace("[", r"\[")):
        make_engine(model, tokenizer).add_request("bad", [1, 2, 3], params)


def test_a_prompt_over_the_context_is_refused(model, tokenizer):
    engine = make_engine(model, tokenizer, max_model_len=64)
    with pytest.raises(RequestRejected, match="maximum context length is 64 tokens"):
        engine.add_request("long", list(range(1, 65)), embedding())


def test_the_longest_embedding_costs_only_its_sender(model, tokenizer, hf_tokenizer, hf_greedy):
    """An embedding of the whole context, sent with a generation request: the
    generation gets a token every step while the embedding's prefill runs in
    chunks, and its tokens are those it gets alone."""
    max_model_len = 1024
    engine = make_engine(model, tokenizer, max_model_len=max_model_len)
    longest = (encode(hf_tokenizer, LONG_TEXT) * 8)[: max_model_len - 1]
    generation = encode(hf_tokenizer, TRIPLES[0][0])
    engine.add_request("gen", generation, greedy(max_tokens=30))
    # The generation's prefill, and its first token.
    generated, embedded = [t for out in engine.step() for t in out.token_ids], None
    engine.add_request("embed", longest, embedding())
    while embedded is None:
        outputs = {out.request_id: out for out in engine.step()}
        assert "gen" in outputs, "a step of the embedding's prefill left the generation out"
        generated += outputs["gen"].token_ids
        embedded = outputs.get("embed")
    assert len(embedded.embedding) == model[1].hidden_size
    while engine.has_work:
        generated += [t for out in engine.step() for t in out.token_ids]
    assert generated == hf_greedy(generation, 30)
