"""A migrated request as the vLLM backend sends it: prompt + delivered tokens, for what is left."""

import pytest

from maas.v1 import common_pb2, engine_pb2
from maas_services.engine.vllm_backend.request_body import ResumeRefused, completion_body


def body(**request) -> dict:
    return completion_body(
        engine_pb2.GenerateRequest(request_id="r", prompt_token_ids=[5, 6, 7], **request),
        served_model="m",
        max_model_len=128,
        cache_salt="s",
    )


def test_the_delivered_tokens_follow_the_prompt_and_count_against_the_limits():
    sent = body(
        sampling=engine_pb2.SamplingParams(max_tokens=10, min_tokens=4, seed=3),
        resume_token_ids=[40, 41, 42],
    )
    assert sent["prompt"] == [5, 6, 7, 40, 41, 42]
    assert (sent["max_tokens"], sent["min_tokens"], sent["seed"]) == (7, 1, 3)


def test_a_request_not_migrated_is_sent_as_before():
    sent = body(sampling=engine_pb2.SamplingParams(max_tokens=10, min_tokens=4))
    assert (sent["prompt"], sent["max_tokens"], sent["min_tokens"]) == ([5, 6, 7], 10, 4)


@pytest.mark.parametrize(
    ("sampling", "why"),
    [
        (engine_pb2.SamplingParams(max_tokens=10, stop=["\n"]), "grammar or stops"),
        (
            engine_pb2.SamplingParams(
                max_tokens=10, grammar=common_pb2.Grammar(kind=common_pb2.Grammar.KIND_JSON_OBJECT)
            ),
            "grammar or stops",
        ),
        (engine_pb2.SamplingParams(max_tokens=2), "leave nothing of max_tokens 2"),
    ],
)
def test_what_vllm_cannot_continue_is_refused(sampling, why):
    with pytest.raises(ResumeRefused, match=why):
        body(sampling=sampling, resume_token_ids=[40, 41])
