"""Blocked terms in tool-call arguments, over HTTP: written plainly or with JSON
escapes the text filter cannot see, they never reach the client decoded."""

import json
import uuid

import httpx
import pytest

from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.tenants import TenantStore
from maas_services.gateway.http_api.http_app import create_app
from maas_services.gateway.http_api.routes.deps import Gateway
from tests.integration.gateway.conftest import MODEL

TOOL = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
# The call's argument spelled plainly, and with a \u escape for its "b".
PLAIN = ['Sure. <tool_call>{"name": "search", "arguments": {"q": "blue', 'berry pie"}}']
ESCAPED = ['Sure. <tool_call>{"name": "search", "arguments": {"q": "\\u0062lue', 'berry pie"}}']
CLOSE = ["</tool_call>", " and more", " text later"]


async def chat(cluster, redis_url, stream: bool) -> list[dict]:
    """The response body, or the stream's chunks."""
    redis = open_redis(redis_url)
    try:
        store = TenantStore(redis)
        tenant = await store.create_tenant(f"calls-{uuid.uuid4().hex[:8]}")
        _, api_key = await store.create_key(tenant.name)
        app = create_app(Gateway(cluster.pipeline, Authenticator(store), redis, 1 << 20))
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "find pie"}],
            "tools": [TOOL],
            "stream": stream,
        }
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            response = await client.post(
                "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {api_key}"}
            )
        await cluster.pipeline.background.wait()
    finally:
        await redis.aclose()
    assert response.status_code == 200, response.text
    if not stream:
        return [response.json()]
    frames = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [json.loads(frame) for frame in frames[:-1]]


def answer(bodies: list[dict]) -> tuple[str, list[dict], str | None]:
    """(content, tool calls, finish_reason) of choice 0, whole or streamed."""
    content, calls, finish = [], [], None
    for body in bodies:
        for choice in body["choices"]:
            part = choice.get("message") or choice.get("delta") or {}
            content.append(part.get("content") or "")
            calls += part.get("tool_calls") or []
            finish = choice["finish_reason"] or finish
    return "".join(content), calls, finish


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("chunks", [PLAIN, ESCAPED], ids=["plain", "escaped"])
async def test_a_call_with_a_blocked_term_ends_the_choice(make_cluster, redis_url, chunks, stream):
    cluster = await make_cluster(
        replicas=1, chunks=chunks + CLOSE, blocked_terms=["BlueBerry"], blocked_terms_action="stop"
    )
    content, calls, finish = answer(await chat(cluster, redis_url, stream))
    assert finish == "content_filter"
    assert calls == []
    assert "blueberry" not in content.lower()
    if stream:
        # Nothing of the choice after the call is sent (the engine's work is stopped).
        assert "and more" not in content


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("chunks", [PLAIN, ESCAPED], ids=["plain", "escaped"])
async def test_a_masked_term_is_masked_in_the_decoded_arguments(
    make_cluster, redis_url, chunks, stream
):
    cluster = await make_cluster(
        replicas=1, chunks=chunks + CLOSE, blocked_terms=["BlueBerry"], blocked_terms_action="mask"
    )
    content, calls, finish = answer(await chat(cluster, redis_url, stream))
    assert finish == "tool_calls"
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"q": "********* pie"}]
    assert content == "Sure.  and more text later"


async def test_a_clean_call_passes_the_filter_unchanged(make_cluster, redis_url):
    chunks = ['<tool_call>{"name": "search", "arguments": {"q": "\\u0070ie"}}', *CLOSE]
    cluster = await make_cluster(
        replicas=1, chunks=chunks, blocked_terms=["BlueBerry"], blocked_terms_action="stop"
    )
    content, calls, finish = answer(await chat(cluster, redis_url, stream=True))
    assert finish == "tool_calls"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("search", {"q": "pie"})
    ]
    assert content == " and more text later"


@pytest.mark.parametrize("stream", [False, True])
async def test_text_stopped_after_a_call_still_ends_with_content_filter(
    make_cluster, redis_url, stream
):
    chunks = ['<tool_call>{"name": "search", "arguments": {"q": "pie"}}', "</tool_call>"]
    cluster = await make_cluster(
        replicas=1,
        chunks=[*chunks, " and blue", "berry", " text later"],
        blocked_terms=["BlueBerry"],
        blocked_terms_action="stop",
    )
    content, calls, finish = answer(await chat(cluster, redis_url, stream))
    # Not "tool_calls": the client must know the answer was cut.
    assert finish == "content_filter"
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"q": "pie"}]
    assert content == " and "
