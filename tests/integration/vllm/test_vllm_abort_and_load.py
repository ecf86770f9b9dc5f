"""Abort frees vLLM's request; GetLoad reports vLLM's own numbers."""

import grpc
import pytest

from maas.v1 import common_pb2, engine_pb2
from tests.integration.router.conftest import eventually
from tests.integration.vllm.conftest import (
    BLOCK_SIZE,
    MAX_NUM_SEQS,
    MODEL_ID,
    generate_request,
    vllm_running,
)

pytestmark = pytest.mark.slow

LONG = {"max_tokens": 1500, "ignore_eos": True}


async def test_client_that_goes_away_aborts_vllm_request(stub, vllm_http):
    call = stub.Generate(generate_request("gone", **LONG))
    await call.read()
    # vLLM's gauges follow its steps, so they may lag the first token.
    await eventually(lambda: _running(stub, 1), timeout=30, what="GetLoad running 1")
    call.cancel()
    await eventually(lambda: _none_running(vllm_http), timeout=30, what="vLLM running 0")


async def test_abort_rpc_ends_the_stream_with_abort(stub, vllm_http):
    call = stub.Generate(generate_request("abort-me", **LONG))
    await call.read()
    reply = await stub.Abort(engine_pb2.AbortRequest(request_id="abort-me"))
    assert reply.found
    rest = []
    while (response := await call.read()) != grpc.aio.EOF:
        rest.append(response)
    assert rest[-1].finish_reason == common_pb2.FINISH_REASON_ABORT
    assert rest[-1].usage.prompt_tokens > 0
    await eventually(lambda: _none_running(vllm_http), timeout=30, what="vLLM running 0")
    missing = await stub.Abort(engine_pb2.AbortRequest(request_id="abort-me"))
    assert not missing.found


async def test_get_load_reports_vllm_cache_and_limits(stub):
    load = await stub.GetLoad(engine_pb2.GetLoadRequest())
    assert load.model == MODEL_ID
    assert (load.block_size, load.max_num_seqs, load.max_model_len) == (
        BLOCK_SIZE,
        MAX_NUM_SEQS,
        2048,
    )
    assert load.kv_cache_blocks > 0
    assert 0.0 <= load.kv_cache_usage <= 1.0
    # The router salts prompts with these, as for a native engine.
    assert (load.cache_salt, load.prefix_cache_sharing) == (MODEL_ID, "tenant")


async def _none_running(client) -> bool:
    return await vllm_running(client) == 0


async def _running(stub, count: int) -> bool:
    return (await stub.GetLoad(engine_pb2.GetLoadRequest())).running == count
