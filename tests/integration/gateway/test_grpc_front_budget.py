"""The tenant gRPC front's stages before a call is served: key, slot, message bytes.

A real front (start_grpc_front) over the stub cluster and tenants in real
Redis, with two slots, a byte budget and short stage deadlines. Calls that
open and send nothing use a request-streaming client on the same method: on
the wire that is a unary call whose message never comes.
"""

import asyncio
import uuid

import grpc
import pytest
from prometheus_client import REGISTRY

from maas.v1 import gateway_pb2, gateway_pb2_grpc
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.body_budget import BodyBudget, BudgetLimits
from maas_services.gateway.admission.tenants import TenantStore
from maas_services.gateway.grpc_api.grpc_front import start_grpc_front
from maas_services.gateway.settings import GatewaySettings
from tests.integration.gateway.conftest import MODEL

SLOTS = 2
MESSAGE_BYTES = 64 * 1024
STAGE_SECONDS = 1.0
COMPLETION = "/maas.v1.Gateway/Completion"
# Long enough for any wait below on a loaded machine; a leak waits forever.
HANG_GUARD_SECONDS = 60


class Front:
    def __init__(self, address: str, store: TenantStore, budget: BodyBudget):
        self.address, self.store, self.budget = address, store, budget

    async def key(self, **limits) -> tuple[str, list[tuple[str, str]]]:
        tenant = await self.store.create_tenant(f"gf-{uuid.uuid4().hex[:8]}", **limits)
        _, api_key = await self.store.create_key(tenant.name)
        return tenant.name, [("authorization", f"Bearer {api_key}")]


@pytest.fixture
async def front(make_cluster, redis_url):
    cluster = await make_cluster(replicas=1)
    settings = GatewaySettings(
        redis_url=redis_url,
        max_body_bytes=MESSAGE_BYTES,
        grpc_max_concurrent_rpcs=SLOTS,
        grpc_message_timeout_seconds=STAGE_SECONDS,
    )
    budget = BodyBudget(
        BudgetLimits(
            total_bytes=16 * MESSAGE_BYTES,
            tenant_bytes=16 * MESSAGE_BYTES,
            body_bytes=MESSAGE_BYTES,
            wait_seconds=0.2,
        )
    )
    redis = open_redis(redis_url)
    store = TenantStore(redis)
    handle = await start_grpc_front(settings, cluster.pipeline, Authenticator(store), budget)
    yield Front(f"127.0.0.1:{handle.port}", store, budget)
    await handle.server.stop(0)
    await redis.aclose()


def completion() -> gateway_pb2.CompletionRequest:
    return gateway_pb2.CompletionRequest(
        model=MODEL, prompt="Hi", options=gateway_pb2.CompletionOptions(max_tokens=2)
    )


async def never():
    """A request stream that sends no message and does not end."""
    await asyncio.Event().wait()
    yield b""


def silent_call(channel: grpc.aio.Channel, metadata):
    return channel.stream_stream(COMPLETION)(never(), metadata=metadata)


async def outcome(call) -> grpc.StatusCode:
    async with asyncio.timeout(HANG_GUARD_SECONDS):
        try:
            async for _ in call:
                pass
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


async def served(channel: grpc.aio.Channel, metadata) -> str:
    stub = gateway_pb2_grpc.GatewayStub(channel)
    async with asyncio.timeout(HANG_GUARD_SECONDS):
        return "".join([c.text async for c in stub.Completion(completion(), metadata=metadata)])


def handled(code: str) -> float:
    labels = {"grpc_service": "maas.v1.Gateway", "grpc_method": "Completion", "grpc_code": code}
    return REGISTRY.get_sample_value("maas_gateway_grpc_server_handled_total", labels) or 0


async def test_keyless_calls_that_send_nothing_end_at_once_and_hold_no_slot(front):
    _, metadata = await front.key()
    refused_before, served_before = handled("UNAUTHENTICATED"), handled("OK")
    async with grpc.aio.insecure_channel(front.address) as channel:
        silent = [silent_call(channel, []) for _ in range(4 * SLOTS)]
        codes = await asyncio.gather(*(outcome(call) for call in silent))
        assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}
        # More keyless calls than slots, and still a call with a key is served.
        assert await served(channel, metadata) == "Hello there"
    # Counted as every call on the port is, request-streaming handlers included.
    assert handled("UNAUTHENTICATED") - refused_before == 4 * SLOTS
    assert handled("OK") - served_before == 1


async def test_keyed_calls_that_send_nothing_are_cut_at_the_deadline(front):
    _, metadata = await front.key()
    async with grpc.aio.insecure_channel(front.address) as channel:
        silent = [silent_call(channel, metadata) for _ in range(SLOTS)]
        codes = await asyncio.gather(*(outcome(call) for call in silent))
        assert set(codes) == {grpc.StatusCode.DEADLINE_EXCEEDED}
        # Their slots and bytes came back with them.
        assert await served(channel, metadata) == "Hello there"
    assert front.budget.held == 0


async def test_an_authenticated_message_counts_against_its_tenant_budget(front):
    # max_concurrency 1: one message's worth of bytes.
    tenant, metadata = await front.key(max_concurrency=1)
    _, other = await front.key(max_concurrency=1)
    async with grpc.aio.insecure_channel(front.address) as channel:
        # A call whose message is still to come holds its reservation meanwhile.
        holder = silent_call(channel, metadata)
        async with asyncio.timeout(HANG_GUARD_SECONDS):
            while front.budget.held_by(tenant) < MESSAGE_BYTES:
                await asyncio.sleep(0.01)
        stub = gateway_pb2_grpc.GatewayStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in stub.Completion(completion(), metadata=metadata):
                pass
        assert await served(channel, other) == "Hello there"
        assert await outcome(holder) == grpc.StatusCode.DEADLINE_EXCEEDED
        assert await served(channel, metadata) == "Hello there"
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dict(refused.value.trailing_metadata())["retry-after"] == "1"
    assert front.budget.held == 0
