"""/v1/embeddings through the whole stack (gateway, tokenizer, router, the native
engine on SmolLM2), with the official openai SDK."""

import json
import math

import openai
import pytest

from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_tools.conformance.main import main

pytestmark = pytest.mark.slow

# (a sentence, its paraphrase, an unrelated sentence)
TRIPLES = [
    (
        "The cat is sleeping on the sofa.",
        "A cat naps on the couch.",
        "Interest rates rose by half a percent this quarter.",
    ),
    (
        "How do I reset my password?",
        "What are the steps to change my password?",
        "The volcano erupted twice last century.",
    ),
    (
        "It is raining heavily in London today.",
        "London is having a lot of rain today.",
        "She plays the violin in an orchestra.",
    ),
]


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=stack.api_key, max_retries=0)


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(
        sum(x * x for x in a) * sum(y * y for y in b)
    )


def test_float_embeddings_are_unit_vectors_one_per_input(client):
    reply = client.embeddings.create(
        model=DEFAULT_MODEL_ID, input=["Hello there.", "Paris is in France."]
    )
    assert [d.index for d in reply.data] == [0, 1]
    # SmolLM2-135M's hidden size.
    assert [len(d.embedding) for d in reply.data] == [576, 576]
    for item in reply.data:
        assert sum(x * x for x in item.embedding) == pytest.approx(1.0, abs=1e-3)
    assert reply.usage.prompt_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens
    assert reply.model == DEFAULT_MODEL_ID


def test_base64_decodes_to_the_float_vector(client):
    text = "The quick brown fox jumps over the lazy dog."
    # The SDK asks for base64 by default and decodes it with numpy.
    packed = client.embeddings.create(model=DEFAULT_MODEL_ID, input=text)
    plain = client.embeddings.create(model=DEFAULT_MODEL_ID, input=text, encoding_format="float")
    assert packed.data[0].embedding == pytest.approx(plain.data[0].embedding, abs=1e-4)
    assert packed.usage == plain.usage


def test_dimensions_truncate_and_renormalize(client):
    reply = client.embeddings.create(model=DEFAULT_MODEL_ID, input="Hello there.", dimensions=64)
    vector = reply.data[0].embedding
    assert len(vector) == 64
    assert sum(x * x for x in vector) == pytest.approx(1.0, abs=1e-3)


def test_token_ids_are_inputs_as_they_are(client):
    reply = client.embeddings.create(
        model=DEFAULT_MODEL_ID, input=[[504, 3458, 30], [504, 3458]], encoding_format="float"
    )
    assert [len(d.embedding) for d in reply.data] == [576, 576]
    assert reply.usage.prompt_tokens == 5
    assert reply.data[0].embedding != reply.data[1].embedding


def test_paraphrases_are_closer_than_unrelated_sentences(client):
    for sentence, paraphrase, unrelated in TRIPLES:
        reply = client.embeddings.create(
            model=DEFAULT_MODEL_ID, input=[sentence, paraphrase, unrelated], encoding_format="float"
        )
        a, b, c = (d.embedding for d in reply.data)
        assert cosine(a, b) > cosine(a, c), sentence
        assert cosine(a, b) > cosine(b, c), sentence


def test_an_input_over_the_context_is_a_400_naming_input(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=DEFAULT_MODEL_ID, input="word " * 10_000)
    assert refused.value.body["param"] == "input"
    assert "maximum context length" in refused.value.body["message"]


def test_an_empty_input_is_a_400_naming_input(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=DEFAULT_MODEL_ID, input="")
    assert refused.value.body["param"] == "input"


def test_dimensions_above_the_models_size_is_a_400_naming_dimensions(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=DEFAULT_MODEL_ID, input="Hello there.", dimensions=577)
    assert refused.value.body["param"] == "dimensions"


def test_the_conformance_suites_embeddings_checks_pass(stack, tmp_path):
    report = tmp_path / "endpoints.json"
    base = f"{stack.gateway_url}/v1"
    flags = ["--key", stack.api_key, "--model", DEFAULT_MODEL_ID, "--only=endpoints"]
    main([base, *flags, "--format", "json", "--output", str(report)])
    checks = {c["id"]: c for c in json.loads(report.read_text())["checks"]}
    for name in ("endpoints.embeddings", "endpoints.embeddings_base64"):
        assert checks[name]["outcome"] == "pass", checks[name]
