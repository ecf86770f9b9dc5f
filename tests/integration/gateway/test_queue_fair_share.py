"""A tenant flooding a deployment cannot keep another tenant out of its queue.

Through the gateway's HTTP app and its tenant gRPC front, over the stub cluster
and real Redis. The deployment has one slot, held by a third tenant's request
until the test lets it go, and 20 waiting places, so every request waits and
the queue's fairness alone decides who is served.
"""

import asyncio
import uuid

import grpc
import httpx
import pytest
from prometheus_client import REGISTRY

from maas.v1 import gateway_pb2, gateway_pb2_grpc
from maas_services.common.openai_api.errors import DROPPED_REASON_HEADER
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.tenants import TenantStore
from maas_services.gateway.grpc_api.grpc_front import start_grpc_front
from maas_services.gateway.http_api.http_app import create_app
from maas_services.gateway.http_api.routes.deps import Gateway
from maas_services.gateway.settings import GatewaySettings
from tests.integration.gateway.conftest import MODEL, read_as_a_front

ONE_SLOT = f"deployments:\n  {MODEL}: {{max_in_flight: 1}}\n"
PLACES = 20
# Long enough for any wait below on a loaded machine.
HANG_GUARD_SECONDS = 120


def displaced() -> float:
    labels = {"reason": "displaced"}
    return REGISTRY.get_sample_value("maas_gateway_queue_rejected_total", labels) or 0.0


async def until(condition, what: str) -> None:
    try:
        async with asyncio.timeout(HANG_GUARD_SECONDS):
            while not condition():
                await asyncio.sleep(0.01)
    except TimeoutError:
        pytest.fail(f"never came: {what}")


def depth() -> float:
    return REGISTRY.get_sample_value("maas_gateway_queue_depth", {"deployment": MODEL}) or 0.0


def answered(tasks) -> int:
    return sum(task.done() for task in tasks)


@pytest.fixture
async def gateway(make_cluster, redis_url):
    """(cluster, store, redis): a gateway whose deployment has one slot and 20 places."""
    cluster = await make_cluster(
        replicas=1, routes=ONE_SLOT, queue_size=PLACES, queue_timeout_seconds=3600
    )
    redis = open_redis(redis_url)
    yield cluster, TenantStore(redis), redis
    await cluster.pipeline.background.wait()
    await redis.aclose()


async def new_key(store: TenantStore, prefix: str) -> tuple[str, str]:
    # Limited, so the limiter keeps each request's lease and charge in Redis.
    tenant = await store.create_tenant(
        f"{prefix}-{uuid.uuid4().hex[:8]}", rpm=100_000, tpm=100_000_000, max_concurrency=1000
    )
    return tenant.name, (await store.create_key(tenant.name))[1]


async def test_a_flood_of_400_requests_leaves_another_tenants_requests_all_served(gateway):
    cluster, store, redis = gateway
    flooder, flooder_key = await new_key(store, "flood")
    _, victim_key = await new_key(store, "victim")
    app = create_app(Gateway(cluster.pipeline, Authenticator(store), redis, 1 << 20))
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    holder = await cluster.complete()  # the one slot, held until the test reads it
    before = displaced()
    # The flood on 64 connections at once: past 100 Redis calls in flight,
    # redis-py's pool (open_redis) refuses and the limiter fails open, which
    # would leave the flood's leases and charges unrecorded.
    connections = asyncio.Semaphore(64)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=None) as client:

        async def post(api_key: str) -> httpx.Response:
            async with connections:
                headers = {"authorization": f"Bearer {api_key}"}
                return await client.post("/v1/completions", json=body, headers=headers)

        def send(api_key: str) -> asyncio.Task:
            return asyncio.create_task(post(api_key))

        flood = [send(flooder_key) for _ in range(400)]
        # The flooder holds every place; the rest of its flood is refused.
        await until(lambda: answered(flood) == 400 - PLACES, "the flood refused past the queue")
        victim = [send(victim_key) for _ in range(10)]
        # Each of the victim's requests takes the place of the flooder's newest.
        await until(lambda: answered(flood) == 400 - PLACES + 10, "10 of the flood displaced")
        assert answered(victim) == 0
        assert [d async for d in read_as_a_front(holder)]
        victims = await asyncio.gather(*victim)
        floods = await asyncio.gather(*flood)
    await cluster.pipeline.background.wait()

    assert [r.status_code for r in victims] == [200] * 10
    served = [r for r in floods if r.status_code == 200]
    refused = [r for r in floods if r.status_code != 200]
    assert len(served) == PLACES - 10
    assert {r.status_code for r in refused} == {429}
    for response in refused:
        assert response.headers[DROPPED_REASON_HEADER] == "queue-fair-share"
        assert int(response.headers["retry-after"]) >= 1
        assert response.json()["error"]["code"] == "rate_limit_exceeded"
    gave_way = [r for r in refused if "gave its place" in r.json()["error"]["message"]]
    assert len(gave_way) == 10
    assert displaced() - before == 10
    # Every refused request, displaced or not, was settled as a queue-full
    # refusal is: its lease ended and its tokens charged 0; the served were
    # charged what they used.
    assert await redis.zcard(f"maas:rl:{{{flooder}}}:inflight") == 0
    charges = [int(v) for v in await redis.hvals(f"maas:rl:{{{flooder}}}:tokens")]
    assert sorted(charges) == [0] * len(refused) + sorted(
        r.json()["usage"]["total_tokens"] for r in served
    )


async def test_a_displaced_grpc_call_is_resource_exhausted_with_the_reason(gateway):
    cluster, store, _ = gateway
    _, flooder_key = await new_key(store, "flood")
    _, victim_key = await new_key(store, "victim")
    front = await start_grpc_front(
        GatewaySettings(grpc_port=0), cluster.pipeline, Authenticator(store)
    )
    holder = await cluster.complete()
    request = gateway_pb2.CompletionRequest(
        model=MODEL, prompt="Hi", options=gateway_pb2.CompletionOptions(max_tokens=2)
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)

            async def call(api_key: str):
                metadata = [("authorization", f"Bearer {api_key}")]
                return [c async for c in stub.Completion(request, metadata=metadata)]

            flood = [asyncio.create_task(call(flooder_key)) for _ in range(PLACES)]
            await until(lambda: depth() == PLACES, "the flooder's calls waiting")
            # One more than its share: refused, and the others keep their places.
            with pytest.raises(grpc.aio.AioRpcError) as excess:
                await call(flooder_key)
            victim = asyncio.create_task(call(victim_key))
            await until(lambda: answered(flood) == 1, "one of the flooder's calls displaced")
            (gone,) = [task for task in flood if task.done()]
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await gone
            assert [d async for d in read_as_a_front(holder)]
            assert await victim
            assert all(await asyncio.gather(*(task for task in flood if task is not gone)))
    finally:
        await front.server.stop(0)
    error = caught.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailing = dict(error.trailing_metadata())
    assert trailing[DROPPED_REASON_HEADER] == "queue-fair-share"
    assert int(trailing["retry-after"]) >= 1
    assert dict(excess.value.trailing_metadata())[DROPPED_REASON_HEADER] == "queue-fair-share"
