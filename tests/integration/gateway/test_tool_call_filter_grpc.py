"""Blocked terms in tool-call arguments on the tenant gRPC front: written plainly or
with JSON escapes, a call that holds one ends the stream with CONTENT_FILTER."""

import json
import uuid

import grpc
import pytest

from maas.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, tokenizer_pb2
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.tenants import TenantStore
from maas_services.gateway.grpc_api.grpc_front import start_grpc_front
from maas_services.gateway.settings import GatewaySettings
from tests.integration.gateway.conftest import MODEL
from tests.integration.gateway.test_tool_call_filter import CLOSE, ESCAPED, PLAIN


async def chat(cluster, redis_url) -> list[gateway_pb2.CompletionChunk]:
    redis = open_redis(redis_url)
    store = TenantStore(redis)
    tenant = await store.create_tenant(f"calls-{uuid.uuid4().hex[:8]}")
    _, api_key = await store.create_key(tenant.name)
    handle = await start_grpc_front(
        GatewaySettings(redis_url=redis_url), cluster.pipeline, Authenticator(store)
    )
    request = gateway_pb2.ChatCompletionRequest(
        model=MODEL,
        messages=[tokenizer_pb2.ChatMessage(role="user", content="find pie")],
        tools=[
            gateway_pb2.Tool(
                type="function",
                function=gateway_pb2.FunctionDefinition(name="search", parameters="{}"),
            )
        ],
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{handle.port}") as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            metadata = [("authorization", f"Bearer {api_key}")]
            return [c async for c in stub.ChatCompletion(request, metadata=metadata)]
    finally:
        await handle.server.stop(0)
        await cluster.pipeline.background.wait()
        await redis.aclose()


@pytest.mark.parametrize("chunks", [PLAIN, ESCAPED], ids=["plain", "escaped"])
async def test_a_call_with_a_blocked_term_ends_the_stream(make_cluster, redis_url, chunks):
    cluster = await make_cluster(
        replicas=1, chunks=chunks + CLOSE, blocked_terms=["BlueBerry"], blocked_terms_action="stop"
    )
    chunks = await chat(cluster, redis_url)
    assert [call for chunk in chunks for call in chunk.tool_calls] == []
    assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_CONTENT_FILTER
    text = "".join(chunk.text for chunk in chunks)
    assert "blueberry" not in text.lower() and "later" not in text


@pytest.mark.parametrize("chunks", [PLAIN, ESCAPED], ids=["plain", "escaped"])
async def test_a_masked_term_is_masked_in_the_decoded_arguments(make_cluster, redis_url, chunks):
    cluster = await make_cluster(
        replicas=1, chunks=chunks + CLOSE, blocked_terms=["BlueBerry"], blocked_terms_action="mask"
    )
    chunks = await chat(cluster, redis_url)
    calls = [call for chunk in chunks for call in chunk.tool_calls]
    assert [json.loads(call.arguments) for call in calls] == [{"q": "********* pie"}]
    assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_TOOL_CALLS
