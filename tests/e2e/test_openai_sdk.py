"""The official openai SDK against the real stack."""

import re

import openai
import pytest

from maas_services.common.model_files import DEFAULT_MODEL_ID

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=stack.api_key, max_retries=0)


def ask(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


def from_cache(create, **kwargs):
    """create(**kwargs) for a prompt already in the engine's prefix cache.

    A prefill's rounding depends on how much of its prompt was cached: SDPA runs
    over the uncached chunk, so in bfloat16 (the default on CUDA and AMX CPUs) a
    greedy near-tie can flip between a first request, one that shares only the
    chat template's blocks with earlier tests, and a repeat. Tests that compare
    two greedy replies take both from the cache, so a difference means the
    requests differ, not their rounding.
    """
    create(**kwargs)
    return create(**kwargs)


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list()] == [DEFAULT_MODEL_ID]


def test_greedy_chat_knows_the_capital_of_france(client):
    reply = client.chat.completions.create(
        model=DEFAULT_MODEL_ID,
        messages=ask("What is the capital of France?"),
        temperature=0,
        max_tokens=32,
    )
    choice = reply.choices[0]
    assert "Paris" in choice.message.content
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.id.startswith("chatcmpl-")


def test_streaming_chat_matches_non_streaming(client):
    kwargs = dict(
        model=DEFAULT_MODEL_ID,
        messages=ask("What is the capital of France?"),
        temperature=0,
        max_tokens=24,
    )
    whole = from_cache(client.chat.completions.create, **kwargs)
    chunks = list(
        client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    # include_usage: every other chunk carries usage null.
    assert all(c.usage is None for c in chunks[:-1])


def test_content_as_text_parts_equals_plain_string(client):
    plain = from_cache(
        client.chat.completions.create,
        model=DEFAULT_MODEL_ID,
        messages=ask("Name a colour."),
        temperature=0,
        max_tokens=8,
    )
    parts = client.chat.completions.create(
        model=DEFAULT_MODEL_ID,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Name a "},
                    {"type": "text", "text": "colour."},
                ],
            }
        ],
        temperature=0,
        max_tokens=8,
    )
    assert parts.choices[0].message.content == plain.choices[0].message.content


def test_text_completion_stream_and_whole(client):
    whole = from_cache(
        client.completions.create,
        model=DEFAULT_MODEL_ID,
        prompt="The capital of France is",
        temperature=0,
        max_tokens=6,
    )
    assert whole.object == "text_completion"
    assert whole.usage.completion_tokens == 6
    assert whole.choices[0].finish_reason == "length"
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=DEFAULT_MODEL_ID,
            prompt="The capital of France is",
            temperature=0,
            max_tokens=6,
            stream=True,
        )
    )
    assert streamed == whole.choices[0].text


def test_stop_string_ends_generation_and_is_not_emitted(client):
    reply = from_cache(
        client.chat.completions.create,
        model=DEFAULT_MODEL_ID,
        messages=ask("Count from 1 to 10, separated by commas."),
        temperature=0,
        max_tokens=40,
    )
    full = reply.choices[0].message.content
    assert "5" in full, full
    stopped = client.chat.completions.create(
        model=DEFAULT_MODEL_ID,
        messages=ask("Count from 1 to 10, separated by commas."),
        temperature=0,
        max_tokens=40,
        stop=["5"],
    )
    text = stopped.choices[0].message.content
    assert stopped.choices[0].finish_reason == "stop"
    assert "5" not in text
    assert full.startswith(text)


def test_seeded_sampling_is_reproducible(client):
    kwargs = dict(
        model=DEFAULT_MODEL_ID, messages=ask("Write a word."), temperature=1.0, max_tokens=12
    )
    first = from_cache(client.chat.completions.create, **kwargs, seed=1234)
    first = first.choices[0].message.content
    again = client.chat.completions.create(**kwargs, seed=1234).choices[0].message.content
    assert first == again


def test_parallel_samples_and_logprobs(client):
    reply = client.chat.completions.create(
        model=DEFAULT_MODEL_ID,
        messages=ask("Name an animal."),
        n=3,
        temperature=1.0,
        seed=5,
        max_tokens=8,
        logprobs=True,
        top_logprobs=2,
    )
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert reply.usage.completion_tokens == sum(len(c.logprobs.content) for c in reply.choices)
    for choice in reply.choices:
        # The end-of-turn token, when sampled, has a logprob but adds no text.
        joined = "".join(t.token for t in choice.logprobs.content).removesuffix("<|im_end|>")
        # A character whose bytes two tokens split (an emoji) shows in their token strings as
        # U+FFFD: the engine sends each token's text, not its bytes, so that is all they say.
        whole = re.sub("\ufffd+", ".+?", re.escape(joined))
        assert re.fullmatch(whole, choice.message.content, re.DOTALL)
        for token in choice.logprobs.content:
            assert token.logprob <= 0
            assert len(token.top_logprobs) == 2
            assert token.top_logprobs[0].logprob >= token.top_logprobs[1].logprob


def test_streamed_parallel_samples_carry_their_index(client):
    chunks = list(
        client.chat.completions.create(
            model=DEFAULT_MODEL_ID,
            messages=ask("Say a number."),
            n=2,
            temperature=0,
            max_tokens=6,
            stream=True,
        )
    )
    texts = {0: "", 1: ""}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    # Greedy samples of one prompt are the same text.
    assert texts[0] == texts[1] and texts[0]
