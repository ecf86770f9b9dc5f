"""Over the gateway's real HTTP server: a client that leaves stops its engine request,
and no task of the HTTP layer waits for it to leave.

The app runs on uvicorn with the gateway's protocol (server.http_server) in the
test's loop, over the stub cluster and real Redis; the client is a raw socket,
so it can leave at an exact point and starts no task of its own.
"""

import asyncio
import json
import uuid

import pytest

from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.tenants import TenantStore
from maas_services.gateway.http_api.routes.deps import Gateway
from maas_services.gateway.server import http_server
from maas_services.gateway.settings import GatewaySettings
from tests.integration.gateway.conftest import MODEL
from tests.integration.gateway.task_count import tasks_created

# Long enough for any wait below on a loaded machine; a leak waits forever.
HANG_GUARD_SECONDS = 60
TOKENS = [f" t{i}" for i in range(8)]


@pytest.fixture
async def serve(make_cluster, redis_url):
    """serve(**make_cluster arguments) -> (cluster, port, api key, tenant name,
    redis): the HTTP front serving over a stub cluster of one engine."""
    running = []

    async def start(**cluster_args):
        cluster = await make_cluster(**{"replicas": 1, "chunks": TOKENS, **cluster_args})
        redis = open_redis(redis_url)
        store = TenantStore(redis)
        # Limited, so the limiter keeps its charge and lease in Redis.
        tenant = await store.create_tenant(
            f"gone-{uuid.uuid4().hex[:8]}", rpm=10_000, tpm=10_000_000, max_concurrency=100
        )
        _, api_key = await store.create_key(tenant.name)
        settings = GatewaySettings(redis_url=redis_url, port=0)
        gateway = Gateway(cluster.pipeline, Authenticator(store), redis, 1 << 20)
        server = http_server(settings, gateway)
        serving = asyncio.create_task(server.serve())
        running.append((server, serving, redis))
        while not server.started:
            assert not serving.done(), "the HTTP server did not start"
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        return cluster, port, api_key, tenant.name, redis

    yield start
    for server, serving, redis in running:
        server.should_exit = True
        await serving
        await redis.aclose()


@pytest.fixture
async def served(serve):
    return await serve()


async def post(port: int, api_key: str, body: dict):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = json.dumps(body).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        + f"authorization: Bearer {api_key}\r\ncontent-length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    await writer.drain()
    return reader, writer


def chat(stream: bool) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": stream}


async def until(condition, what: str) -> None:
    async with asyncio.timeout(HANG_GUARD_SECONDS):
        while not condition():
            await asyncio.sleep(0.01)


async def events_of(redis, request_id: str) -> list[UsageEvent]:
    # Other tests share the stream.
    entries = await redis.xrange(USAGE_STREAM)
    return [UsageEvent.from_fields(f) for _, f in entries if f.get("request_id") == request_id]


async def leave_when_engine_is_stuck(served, stream: bool, stall_after: int) -> str:
    """Start a chat and leave once the engine has sent `stall_after` tokens
    (and the gateway has sent the first one on) and is stuck; the request's id."""
    cluster, port, api_key, _, _ = served
    (engine,) = cluster.engines
    engine.stall_after = stall_after
    reader, writer = await post(port, api_key, chat(stream))
    if stall_after:
        await reader.readuntil(b"data: ")  # the role chunk, after the first token
    await until(lambda: engine.active, "the engine to get the request")
    (request_id,) = engine.active
    writer.close()
    await until(lambda: request_id in engine.cancelled_at, "the engine call to be cancelled")
    await cluster.pipeline.background.wait()
    return request_id


async def test_a_client_gone_while_the_engine_stalls_mid_stream_is_settled(served):
    """The engine sent one token and then nothing: only the gateway's notice of
    the loss can end the request, since no next token (or send) would come."""
    cluster, _, _, tenant, redis = served
    request_id = await leave_when_engine_is_stuck(served, stream=True, stall_after=1)
    (event,) = await events_of(redis, request_id)
    assert (event.completion_tokens, event.finish_reason) == (1, "client_disconnect")
    charged = await redis.hget(f"maas:rl:{{{tenant}}}:tokens", request_id)
    assert int(charged) == event.prompt_tokens + 1
    assert await redis.zcard(f"maas:rl:{{{tenant}}}:inflight") == 0
    assert cluster.router.releases == []  # the router learns the end from the engine


@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_gone_before_the_first_token_ends_the_request(served, stream):
    cluster, _, _, tenant, redis = served
    request_id = await leave_when_engine_is_stuck(served, stream, stall_after=0)
    # The stub computed nothing before its first token: nothing billed, the reservation refunded.
    assert await events_of(redis, request_id) == []
    assert int(await redis.hget(f"maas:rl:{{{tenant}}}:tokens", request_id)) == 0
    assert await redis.zcard(f"maas:rl:{{{tenant}}}:inflight") == 0
    assert cluster.router.releases == []  # the router learns the end from the engine


def origin(task: asyncio.Task) -> str:
    coro = task.get_coro()
    code = getattr(coro, "cr_code", None)
    where = code.co_filename if code is not None else type(coro).__name__
    return f"{where}:{getattr(coro, '__qualname__', '')}"


# What made tasks per streamed request before: Starlette streaming from a task
# beside its http.disconnect listener, and the first-token wait racing the
# work (wrapped: _wrap_awaitable or the generator's asend) against a listener.
HTTP_LAYER = ("starlette", "anyio", "fastapi", "disconnect.py", "_wrap_awaitable", "asend")


async def test_a_streamed_request_makes_no_task_of_the_http_layer(served):
    _, port, api_key, _, _ = served
    with tasks_created() as created:
        reader, writer = await post(port, api_key, chat(stream=True))
        await reader.readuntil(b"data: [DONE]\n\n")
        writer.close()
    origins = [origin(task) for task in created]
    assert any("run_asgi" in o for o in origins), origins  # uvicorn's task for the request
    assert [o for o in origins if any(part in o for part in HTTP_LAYER)] == [], origins


async def test_a_client_gone_while_queued_gives_its_place_up_at_once(serve):
    """One slot, held by a stalled stream: the second request waits for it,
    and its leaving must not wait for the first to end (nor the queue timeout)."""
    one_slot = f"deployments:\n  {MODEL}: {{max_in_flight: 1}}\n"
    cluster, port, api_key, tenant, redis = await serve(routes=one_slot, queue_timeout_seconds=3600)
    (engine,) = cluster.engines
    engine.stall_after = 1
    holder, holding = await post(port, api_key, chat(stream=True))
    await holder.readuntil(b"data: ")
    _, waiting = await post(port, api_key, chat(stream=True))
    leases = f"maas:rl:{{{tenant}}}:inflight"
    async with asyncio.timeout(HANG_GUARD_SECONDS):
        while await redis.zcard(leases) < 2:  # the second is counted
            await asyncio.sleep(0.01)
        waiting.close()
        while await redis.zcard(leases) > 1:  # and its lease is given back
            await asyncio.sleep(0.01)
    await cluster.pipeline.background.wait()
    assert engine.served == 1 and len(engine.active) == 1  # the first still streams
    holding.close()
