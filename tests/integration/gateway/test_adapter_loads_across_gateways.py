"""The on-demand adapter-load bounds hold across gateway replicas: two AdapterLoads, each
with its own Redis client and limiter, on one real Redis, allow a tenant its loads per
minute and one load in flight, not twice either; a burst on one adapter still costs one
load; a tenant at its bounds costs only itself; Redis down follows the limiter's policy;
a NOT_FOUND that crossed a finished load costs nothing."""

import asyncio
import time
import uuid

import pytest

from maas.v1 import engine_pb2, router_pb2
from maas_services.common.openai_api.errors import DROPPED_REASON_HEADER, APIError
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.rate_limiter import RateLimiter
from maas_services.gateway.admission.tenants import Tenant
from maas_services.gateway.routing.routing_table import Route, Tier
from maas_services.gateway.upstream.adapter_loads import BUSY_REASON, RATE_REASON, AdapterLoads
from maas_tools.local.ports import free_port


class Engine:
    """Records the loads asked of it; holds each until `gate` is set, when there is one."""

    def __init__(self):
        self.loads: list[str] = []
        self.gate: asyncio.Event | None = None

    async def LoadAdapter(self, request: engine_pb2.LoadAdapterRequest, timeout: float):
        self.loads.append(request.name)
        if self.gate is not None:
            await self.gate.wait()
        return engine_pb2.AdapterStatus(name=request.name, source=request.source)


class Upstreams:
    def __init__(self):
        self.stub = Engine()

    def engine(self, address: str, endpoint_id: str) -> Engine:
        return self.stub


def route(adapter: str) -> Route:
    return Route(adapter, "base", "base", None, Tier(), adapter=adapter, adapter_source="/a")


def pick(endpoint: str) -> router_pb2.PickResponse:
    return router_pb2.PickResponse(endpoint_id=endpoint, address="127.0.0.1:1")


def tenant(**limits) -> Tenant:
    return Tenant(name=f"loads-{uuid.uuid4().hex[:8]}", **limits)


@pytest.fixture
async def gateways(redis_url):
    """gateways(**limiter settings) -> two (AdapterLoads, its engine) on the same Redis."""
    clients = []

    def make(url: str = redis_url, per_minute: int = 10, **limiter):
        pair = []
        for _ in range(2):
            redis = open_redis(url)
            clients.append(redis)
            up = Upstreams()
            limits = RateLimiter(redis, lease_seconds=60, **limiter)
            pair.append((AdapterLoads(up, limits, per_minute, timeout=5), up.stub))
        return pair

    yield make
    for redis in clients:
        await redis.aclose()


async def refusal(loads: AdapterLoads, who: Tenant, adapter: str, endpoint: str) -> APIError:
    with pytest.raises(APIError) as caught:
        await loads.load(who, route(adapter), pick(endpoint), time.monotonic())
    assert (caught.value.status, caught.value.code) == (429, "rate_limit_exceeded")
    return caught.value


async def test_two_gateways_together_allow_the_tenants_loads_per_minute(gateways):
    (a, engine_a), (b, engine_b) = gateways()
    greedy = tenant(adapter_loads_per_minute=3)
    for i, loads in enumerate((a, b, a)):
        await loads.load(greedy, route(f"x{i}"), pick(f"e{i}"), time.monotonic())
    for loads in (a, b):
        refused = await refusal(loads, greedy, "x9", "e9")
        assert refused.headers[DROPPED_REASON_HEADER] == RATE_REASON
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert "3 per minute" in refused.message
    assert len(engine_a.loads) + len(engine_b.loads) == 3
    # Its budget is its own: another tenant loads on either gateway.
    other = tenant(adapter_loads_per_minute=3)
    await b.load(other, route("y"), pick("e0"), time.monotonic())
    assert engine_b.loads[-1] == "y"


async def test_one_load_in_flight_per_tenant_across_gateways(gateways):
    (a, engine_a), (b, engine_b) = gateways()
    engine_a.gate = asyncio.Event()
    greedy = tenant()
    held = asyncio.create_task(a.load(greedy, route("x0"), pick("e0"), time.monotonic()))
    async with asyncio.timeout(10):
        while not engine_a.loads:
            await asyncio.sleep(0.01)
    # Every other load of the tenant, on either gateway, is refused at once.
    for loads in (a, b):
        for i in range(1, 5):
            refused = await refusal(loads, greedy, f"x{i}", f"e{i}")
            assert refused.headers[DROPPED_REASON_HEADER] == BUSY_REASON
    # Another tenant's load is not: the bound is the greedy tenant's alone.
    await b.load(tenant(), route("y"), pick("e1"), time.monotonic())
    assert engine_b.loads == ["y"]
    engine_a.gate.set()
    await held
    # The load ended and gave its place back: the other gateway may load now.
    await b.load(greedy, route("x1"), pick("e1"), time.monotonic())
    assert engine_b.loads == ["y", "x1"]


async def test_a_burst_on_one_adapter_costs_one_load_of_the_budget(gateways):
    (a, engine_a), (b, engine_b) = gateways()
    engine_a.gate = asyncio.Event()
    greedy = tenant(adapter_loads_per_minute=2)
    sent = time.monotonic()
    burst = [asyncio.create_task(a.load(greedy, route("x"), pick("e0"), sent)) for _ in range(20)]
    async with asyncio.timeout(10):
        while not engine_a.loads:
            await asyncio.sleep(0.01)
    engine_a.gate.set()
    await asyncio.gather(*burst)
    assert engine_a.loads == ["x"]
    # One of the two loads is left, on whichever gateway.
    await b.load(greedy, route("z"), pick("e1"), time.monotonic())
    assert (await refusal(a, greedy, "w", "e2")).headers[DROPPED_REASON_HEADER] == RATE_REASON


async def test_the_budget_comes_back_as_the_window_slides(gateways):
    (a, _), (b, engine_b) = gateways(window_seconds=0.5)
    greedy = tenant(adapter_loads_per_minute=1)
    await a.load(greedy, route("x0"), pick("e0"), time.monotonic())
    refused = await refusal(b, greedy, "x1", "e1")
    assert refused.headers["Retry-After"] == "1"
    await asyncio.sleep(0.6)
    await b.load(greedy, route("x1"), pick("e1"), time.monotonic())
    assert engine_b.loads == ["x1"]


async def test_redis_down_loads_as_the_limiters_policy_says(gateways):
    unreachable = f"redis://127.0.0.1:{free_port()}/0"
    (opened, engine), _ = gateways(unreachable, on_redis_error="fail_open")
    greedy = tenant(adapter_loads_per_minute=1)
    for i in range(3):
        await opened.load(greedy, route(f"x{i}"), pick("e0"), time.monotonic())
    assert engine.loads == ["x0", "x1", "x2"]
    (closed, engine), _ = gateways(unreachable, on_redis_error="fail_closed")
    with pytest.raises(APIError) as caught:
        await closed.load(greedy, route("x0"), pick("e0"), time.monotonic())
    assert caught.value.status == 503 and engine.loads == []


async def test_a_not_found_sent_before_a_finished_load_is_sent_again_unloaded(redis_url):
    up = Upstreams()
    redis = open_redis(redis_url)
    loads = AdapterLoads(up, RateLimiter(redis, lease_seconds=60), per_minute=10, timeout=5)
    who, where, sent = tenant(), pick("e0"), time.monotonic()
    await loads.load(who, route("a"), where, sent)
    # Sent before that load finished: it crossed it.
    await loads.load(who, route("a"), where, sent)
    assert up.stub.loads == ["a"]
    # Sent after it: the adapter went again, load it again.
    await loads.load(who, route("a"), where, time.monotonic())
    assert up.stub.loads == ["a", "a"]
    await redis.aclose()
