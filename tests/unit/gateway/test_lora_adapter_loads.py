"""AdapterLoads' bookkeeping: a NOT_FOUND that crossed a finished load costs nothing.
Its bounds in Redis: tests/integration/gateway/test_adapter_loads_across_gateways.py."""

import time
import uuid

from maas.v1 import engine_pb2, router_pb2
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.rate_limiter import RateLimiter
from maas_services.gateway.admission.tenants import Tenant
from maas_services.gateway.routing.routing_table import Route, Tier
from maas_services.gateway.upstream.adapter_loads import AdapterLoads

ROUTE = Route("a", "base", "base", None, Tier(), adapter="a", adapter_source="/adapters/a")
PICK = router_pb2.PickResponse(endpoint_id="e0", address="127.0.0.1:1")


class Engine:
    def __init__(self):
        self.loads: list[str] = []

    async def LoadAdapter(self, request: engine_pb2.LoadAdapterRequest, timeout: float):
        self.loads.append(request.name)
        return engine_pb2.AdapterStatus(name=request.name, source=request.source)


class Upstreams:
    def __init__(self):
        self.stub = Engine()

    def engine(self, address: str, endpoint_id: str) -> Engine:
        return self.stub


async def test_a_not_found_sent_before_a_finished_load_is_sent_again_unloaded(redis_url):
    up = Upstreams()
    redis = open_redis(redis_url)
    loads = AdapterLoads(up, RateLimiter(redis, lease_seconds=60), per_minute=10, timeout=5)
    tenant = Tenant(name=f"t-{uuid.uuid4().hex[:8]}")
    sent = time.monotonic()
    await loads.load(tenant, ROUTE, PICK, sent)
    # Sent before that load finished: it crossed it.
    await loads.load(tenant, ROUTE, PICK, sent)
    assert up.stub.loads == ["a"]
    # Sent after it: the adapter went again, load it again.
    await loads.load(tenant, ROUTE, PICK, time.monotonic())
    assert up.stub.loads == ["a", "a"]
    await redis.aclose()
