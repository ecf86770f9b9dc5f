"""Generate through the adapter against the same vLLM server called directly."""

import json

import grpc
import pytest

from maas.v1 import common_pb2
from tests.integration.vllm.conftest import PROMPT, SERVED_MODEL, generate_request

pytestmark = pytest.mark.slow


async def collect(stub, request):
    return [r async for r in stub.Generate(request)]


def ids_of(responses, index=0):
    return [t for r in responses if r.index == index for t in r.token_ids]


async def test_greedy_equals_vllm_direct(stub, vllm_http):
    responses = await collect(
        stub, generate_request("greedy", max_tokens=12, ignore_eos=True, temperature=0.0)
    )
    direct = await vllm_http.post(
        "/v1/completions",
        json={
            "model": SERVED_MODEL,
            "prompt": PROMPT,
            "max_tokens": 12,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    choice = direct.json()["choices"][0]
    assert ids_of(responses) == choice["token_ids"]
    assert "".join(r.text for r in responses) == choice["text"]


async def test_stream_usage_and_tenant_salted_cache(stub):
    first = await collect(stub, generate_request("u1", tenant="a", max_tokens=5, ignore_eos=True))
    last = first[-1]
    assert last.finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(PROMPT), 5)
    assert last.computed_prompt_tokens == len(PROMPT)
    assert all(not r.HasField("usage") for r in first[:-1])
    # The same tenant hits its own full block; another tenant does not.
    again = await collect(stub, generate_request("u2", tenant="a", max_tokens=1))
    assert again[-1].usage.cached_prompt_tokens == 32
    other = await collect(stub, generate_request("u3", tenant="b", max_tokens=1))
    assert other[-1].usage.cached_prompt_tokens == 0


async def test_n_samples_each_finish_with_usage(stub):
    responses = await collect(
        stub,
        generate_request("n3", n=3, temperature=1.0, seed=7, max_tokens=4, ignore_eos=True),
    )
    finals = {r.index: r for r in responses if r.finish_reason}
    assert sorted(finals) == [0, 1, 2]
    for index, final in finals.items():
        assert final.usage.completion_tokens == len(ids_of(responses, index)) == 4


async def test_logprobs_name_their_tokens(stub, vllm_http):
    responses = await collect(
        stub,
        generate_request("lp", max_tokens=4, ignore_eos=True, logprobs=True, top_logprobs=3),
    )
    logprobs = [lp for r in responses for lp in r.logprobs]
    assert [lp.token_id for lp in logprobs] == ids_of(responses)
    for lp in logprobs:
        assert len(lp.top_logprobs) == 3
        # Greedy: the sampled token is the most likely one.
        assert lp.top_logprobs[0].token_id == lp.token_id
        assert lp.top_logprobs[0].logprob == pytest.approx(lp.logprob, abs=1e-4)
        # The text a token adds (vLLM's tokenizer is ours: the adapter checked), not "Ġthe".
        text = await vllm_http.post(
            "/detokenize", json={"model": SERVED_MODEL, "tokens": [lp.token_id]}
        )
        assert lp.token == text.json()["prompt"]


async def test_stop_string_ends_the_text_before_it(stub):
    free = await collect(stub, generate_request("free", max_tokens=12, ignore_eos=True))
    text = "".join(r.text for r in free)
    stop = text[len(text) // 2 :][:3]
    stopped = await collect(
        stub, generate_request("stop", max_tokens=12, ignore_eos=True, stop=[stop])
    )
    assert stopped[-1].finish_reason == common_pb2.FINISH_REASON_STOP
    assert "".join(r.text for r in stopped) == text[: text.index(stop)]


async def test_json_schema_grammar_gives_json(stub):
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    grammar = common_pb2.Grammar(kind=common_pb2.Grammar.KIND_JSON_SCHEMA, text=json.dumps(schema))
    responses = await collect(stub, generate_request("json", max_tokens=20, grammar=grammar))
    assert responses[-1].finish_reason == common_pb2.FINISH_REASON_STOP
    assert isinstance(json.loads("".join(r.text for r in responses))["answer"], int)


async def test_prompt_past_the_context_is_invalid_argument(stub):
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await collect(stub, generate_request("long", prompt=PROMPT * 60, max_tokens=1))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
