"""Whatever sampling parameters a request carries, only that request can fail.

Hypothesis sends arbitrary SamplingParams, valid or not, to a served engine
while a victim stream is running beside them: the attacker gets tokens or
INVALID_ARGUMENT, never an engine failure, and the victim always finishes
with all its tokens.
"""

import asyncio

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maas.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from maas_services.common.engine_metadata import was_scheduled
from tests.integration.engine.test_engine_server import read_all, request

pytestmark = pytest.mark.slow

VICTIM_TOKENS = 12
INT32 = st.integers(-(2**31), 2**31 - 1)
ODD_FLOATS = st.one_of(
    st.floats(width=32, allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1e-40, 1e-6, 3e38]),
)
# 0 would mean "the rest of the context": thousands of tokens.
MAX_TOKENS = st.integers(1, 4)
SEEDS = st.one_of(st.none(), st.integers(0, 2**64 - 1), st.just(2**64 - 1))
# What the gateway's API lets a client send: mostly requests that run.
API_SAMPLING = st.fixed_dictionaries(
    {
        "temperature": st.floats(0, 2, width=32),
        "top_p": st.floats(0, 1, exclude_min=True, width=32),
        "top_k": st.integers(0, 60_000),
        "min_p": st.floats(0, 1, width=32),
        "repetition_penalty": st.one_of(
            st.floats(0, 2, exclude_min=True, width=32), st.sampled_from([1e-40, 1e-30])
        ),
        "presence_penalty": st.floats(-2, 2, width=32),
        "frequency_penalty": st.floats(-2, 2, width=32),
        "seed": SEEDS,
        "stop": st.lists(st.text(min_size=1, max_size=8), max_size=4),
        "stop_token_ids": st.lists(st.integers(0, 50_000), max_size=4),
        "max_tokens": MAX_TOKENS,
        "min_tokens": st.integers(0, 4),
        "ignore_eos": st.booleans(),
        "n": st.integers(1, 16),
        "logprobs": st.booleans(),
        "top_logprobs": st.integers(0, 20),
        "speculative": st.booleans(),
    }
)
# Anything the proto can carry.
ANY_SAMPLING = st.fixed_dictionaries(
    {
        "temperature": ODD_FLOATS,
        "top_p": ODD_FLOATS,
        "top_k": INT32,
        "min_p": ODD_FLOATS,
        "repetition_penalty": ODD_FLOATS,
        "presence_penalty": ODD_FLOATS,
        "frequency_penalty": ODD_FLOATS,
        "seed": SEEDS,
        "stop": st.lists(st.text(max_size=300), max_size=18),
        "stop_token_ids": st.lists(INT32, max_size=300),
        "max_tokens": MAX_TOKENS,
        "min_tokens": INT32,
        "ignore_eos": st.booleans(),
        "n": INT32,
        "logprobs": st.booleans(),
        "top_logprobs": INT32,
        "speculative": st.booleans(),
    }
)
SAMPLING = st.one_of(API_SAMPLING, ANY_SAMPLING)


def attacker(sampling: dict) -> engine_pb2.GenerateRequest:
    seed = sampling.pop("seed")
    params = engine_pb2.SamplingParams(**sampling)
    if seed is not None:
        params.seed = seed
    return engine_pb2.GenerateRequest(
        request_id="attacker", prompt_token_ids=[1, 4093, 314, 253, 2365, 30], sampling=params
    )


async def attack(address: str, sampling: dict) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        victim = stub.Generate(request("victim", VICTIM_TOKENS))
        first = await victim.read()
        try:
            await read_all(stub.Generate(attacker(sampling)))
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()
        rest = [first, *await read_all(victim)]
    assert rest[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert sum(len(r.token_ids) for r in rest) == VICTIM_TOKENS


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sampling=SAMPLING)
def test_any_sampling_parameters_leave_a_running_victim_whole(engine, sampling):
    _, address = engine
    asyncio.run(attack(address, sampling))


async def test_the_largest_seed_with_two_samples_completes(engine):
    _, address = engine
    sampled = attacker({"temperature": 1.0, "max_tokens": 4, "n": 2, "seed": 2**64 - 1})
    async with grpc.aio.insecure_channel(address) as channel:
        responses = await read_all(engine_pb2_grpc.EngineStub(channel).Generate(sampled))
    finished = [r for r in responses if r.finish_reason]
    assert sorted(r.index for r in finished) == [0, 1]
    assert {r.finish_reason for r in finished} == {common_pb2.FINISH_REASON_LENGTH}


async def test_a_request_is_told_when_it_enters_a_step_and_only_then(engine):
    _, address = engine
    async with grpc.aio.insecure_channel(address) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        served = stub.Generate(request("served", 2))
        await read_all(served)
        refused = stub.Generate(request("refused", 2, temperature=-1))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await read_all(refused)
    assert was_scheduled(await served.initial_metadata())
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not was_scheduled(caught.value.initial_metadata())
