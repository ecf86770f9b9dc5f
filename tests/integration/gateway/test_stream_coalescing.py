"""Tokens ready together go out in one chunk, with nothing else changed.

A client slow to read (its first write does not return until the engine has
sent every token) gets the rest in fewer chunks than tokens, and the same
text, logprobs (one entry per token), tool calls, masked terms, finish reason
and usage as a client that reads each token as it comes. Tokens the engine
sends together (one message) reach a gRPC client in one chunk.
"""

import asyncio
import json
import uuid

import grpc
import httpx
import pytest

from maas.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, tokenizer_pb2
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.tenants import TenantStore
from maas_services.gateway.grpc_api.grpc_front import start_grpc_front
from maas_services.gateway.http_api.http_app import create_app
from maas_services.gateway.http_api.routes.deps import Gateway
from maas_services.gateway.settings import GatewaySettings
from tests.integration.gateway.conftest import MODEL

WORDS = [f" w{i}" for i in range(40)]
TOOL = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
CALL = ["Sure.", " <tool_call>", '{"name": "search", ', '"arguments": {"q": "blue', "berry"]
CALL_END = [' pie"}}', "</tool_call>", " and", " more"]


def slow_reader(app, engine):
    """The app as a client slow to read sees it: its first body write waits until
    the engine has sent its last token (and the gateway has had time to read it)."""

    async def wrapped(scope, receive, send):
        waited = False

        async def slow_send(message):
            nonlocal waited
            if message["type"] == "http.response.body" and not waited:
                waited = True
                while engine.active:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.2)
            await send(message)

        await app(scope, receive, slow_send)

    return wrapped


async def stream(cluster, redis_url, body: dict, slow: bool) -> list[dict]:
    """The stream's chunks, read promptly or slowly."""
    redis = open_redis(redis_url)
    try:
        store = TenantStore(redis)
        tenant = await store.create_tenant(f"coalesce-{uuid.uuid4().hex[:8]}")
        _, api_key = await store.create_key(tenant.name)
        app = create_app(Gateway(cluster.pipeline, Authenticator(store), redis, 1 << 20))
        if slow:
            app = slow_reader(app, cluster.engines[0])
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            response = await client.post(
                body.pop("path", "/v1/chat/completions"),
                json={"model": MODEL, "stream": True, **body},
                headers={"authorization": f"Bearer {api_key}"},
            )
        await cluster.pipeline.background.wait()
    finally:
        await redis.aclose()
    assert response.status_code == 200, response.text
    frames = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [json.loads(frame) for frame in frames[:-1]]


def text_chunks(chunks: list[dict]) -> list[dict]:
    return [
        c for c in chunks if c["choices"] and (c["choices"][0].get("delta") or {}).get("content")
    ]


def content(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def logprob_tokens(chunks: list[dict]) -> list[tuple[str, float]]:
    return [
        (entry["token"], entry["logprob"])
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
        for entry in c["choices"][0]["logprobs"]["content"]
    ]


def finish(chunks: list[dict]) -> str | None:
    return next(c["choices"][0]["finish_reason"] for c in reversed(chunks) if c["choices"])


async def both(cluster, redis_url, body: dict) -> tuple[list[dict], list[dict]]:
    """(a prompt reader's chunks, a slow reader's chunks) of the same request."""
    return (
        await stream(cluster, redis_url, dict(body), slow=False),
        await stream(cluster, redis_url, dict(body), slow=True),
    )


async def test_a_slow_reader_gets_fewer_chunks_with_every_token_and_logprob(
    make_cluster, redis_url
):
    cluster = await make_cluster(replicas=1, chunks=WORDS, delay=0.002)
    cluster.engines[0].logprobs = True
    body = {
        "messages": [{"role": "user", "content": "count"}],
        "logprobs": True,
        "top_logprobs": 1,
        "stream_options": {"include_usage": True},
    }
    prompt, slow = await both(cluster, redis_url, body)

    assert content(slow) == content(prompt) == "".join(WORDS)
    assert len(text_chunks(slow)) < len(WORDS)
    # One logprobs entry per token, in order, whatever chunk it rode in.
    assert logprob_tokens(slow) == logprob_tokens(prompt)
    assert [token for token, _ in logprob_tokens(slow)] == WORDS
    for chunk in text_chunks(slow):
        choice = chunk["choices"][0]
        tokens = "".join(entry["token"] for entry in choice["logprobs"]["content"])
        assert tokens == choice["delta"]["content"]
    assert finish(slow) == finish(prompt) == "stop"
    assert slow[-1]["usage"]["completion_tokens"] == prompt[-1]["usage"]["completion_tokens"]
    assert slow[-1]["usage"]["completion_tokens"] == len(WORDS)


async def test_a_text_completion_keeps_its_offsets(make_cluster, redis_url):
    cluster = await make_cluster(replicas=1, chunks=WORDS, delay=0.002)
    cluster.engines[0].logprobs = True
    body = {"path": "/v1/completions", "prompt": "count", "logprobs": 1}
    prompt, slow = await both(cluster, redis_url, body)

    def offsets(chunks):
        return [o for c in chunks for o in c["choices"][0]["logprobs"]["text_offset"]]

    def text(chunks):
        return "".join(c["choices"][0]["text"] for c in chunks)

    assert text(slow) == text(prompt) == "".join(WORDS)
    assert len(slow) < len(prompt)
    assert offsets(slow) == offsets(prompt)


@pytest.mark.parametrize("action", ["mask", "stop"])
async def test_tool_calls_and_blocked_terms_come_out_the_same(make_cluster, redis_url, action):
    cluster = await make_cluster(
        replicas=1,
        chunks=CALL + CALL_END + WORDS,
        delay=0.002,
        blocked_terms=["BlueBerry"],
        blocked_terms_action=action,
    )
    body = {"messages": [{"role": "user", "content": "find pie"}], "tools": [TOOL]}
    prompt, slow = await both(cluster, redis_url, body)

    def calls(chunks):
        # Without their ids, drawn afresh for each response.
        return [
            {**call, "id": None}
            for c in chunks
            for call in c["choices"][0]["delta"].get("tool_calls", [])
        ]

    assert content(slow) == content(prompt)
    assert calls(slow) == calls(prompt)
    assert finish(slow) == finish(prompt)
    assert "blueberry" not in content(slow).lower()
    if action == "mask":
        assert [json.loads(c["function"]["arguments"]) for c in calls(slow)] == [
            {"q": "********* pie"}
        ]
        assert len(text_chunks(slow)) < len(text_chunks(prompt))


async def grpc_chat(cluster, redis_url) -> list[gateway_pb2.CompletionChunk]:
    redis = open_redis(redis_url)
    store = TenantStore(redis)
    tenant = await store.create_tenant(f"coalesce-{uuid.uuid4().hex[:8]}")
    _, api_key = await store.create_key(tenant.name)
    handle = await start_grpc_front(
        GatewaySettings(redis_url=redis_url), cluster.pipeline, Authenticator(store)
    )
    request = gateway_pb2.ChatCompletionRequest(
        model=MODEL, messages=[tokenizer_pb2.ChatMessage(role="user", content="count")]
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


async def test_the_grpc_front_sends_tokens_ready_together_in_one_chunk(make_cluster, redis_url):
    cluster = await make_cluster(replicas=1, chunks=WORDS, delay=0.002)
    # Eight tokens at a time, each eight in one engine message.
    cluster.engines[0].burst, cluster.engines[0].merged = 8, True
    chunks = await grpc_chat(cluster, redis_url)

    assert "".join(chunk.text for chunk in chunks) == "".join(WORDS)
    assert len(chunks) == len(WORDS) // 8
    assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_STOP
    assert chunks[-1].usage.completion_tokens == len(WORDS)


async def test_a_slow_client_that_leaves_is_billed_the_tokens_it_was_sent(make_cluster, redis_url):
    """A client that falls behind and leaves is billed what reached it
    (docs/billing.md, "Requests cut short"), not what the engine had sent the
    gateway for it meanwhile and the gateway never wrote."""
    cluster = await make_cluster(replicas=1, chunks=WORDS)
    (engine,) = cluster.engines
    # A token every 10 ms: the first write is the first token's alone, the
    # second (the client's last) holds what came while the first was out.
    engine.delay = 0.01
    engine.stall_after = 20  # the engine then waits: the request is never finished
    received: list[bytes] = []

    def leaves_at_its_second_write(app):
        async def wrapped(scope, receive, send):
            async def leaving_send(message):
                if message["type"] == "http.response.body" and message.get("body"):
                    if received:
                        # Behind while the engine sends its 20 tokens, then gone.
                        await asyncio.sleep(0.5)
                        raise OSError("the client left")
                    received.append(message["body"])
                await send(message)

            await app(scope, receive, leaving_send)

        return wrapped

    redis = open_redis(redis_url)
    try:
        store = TenantStore(redis)
        tenant = await store.create_tenant(f"leaver-{uuid.uuid4().hex[:8]}")
        _, api_key = await store.create_key(tenant.name)
        app = create_app(Gateway(cluster.pipeline, Authenticator(store), redis, 1 << 20))
        transport = httpx.ASGITransport(app=leaves_at_its_second_write(app))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            with pytest.raises(Exception):  # noqa: B017 (whatever the transport makes of it)
                await client.post(
                    "/v1/chat/completions",
                    json={
                        "model": MODEL,
                        "stream": True,
                        "messages": [{"role": "user", "content": "count"}],
                    },
                    headers={"authorization": f"Bearer {api_key}"},
                )
        await cluster.pipeline.background.wait()
        entries = await redis.xrange(USAGE_STREAM)
    finally:
        await redis.aclose()
    (event,) = [UsageEvent.from_fields(f) for _, f in entries if f.get("tenant") == tenant.name]
    frames = [line[6:] for line in received[0].decode().splitlines() if line.startswith("data: ")]
    sent = content([json.loads(frame) for frame in frames]).count(" w")  # one per token
    assert event.finish_reason == "client_disconnect"
    assert event.completion_tokens == sent >= 1
