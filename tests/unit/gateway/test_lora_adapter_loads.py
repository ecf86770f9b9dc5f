"""AdapterLoads' bookkeeping: a NOT_FOUND that crossed a finished load costs nothing,
and the token bucket refills at the tenant's rate."""

import time
from types import SimpleNamespace

import pytest

from maas.v1 import engine_pb2, router_pb2
from maas_services.common.openai_api.errors import APIError
from maas_services.gateway.admission.tenants import Tenant
from maas_services.gateway.routing.routing_table import Route, Tier
from maas_services.gateway.upstream import adapter_loads
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


async def test_a_not_found_sent_before_a_finished_load_is_sent_again_unloaded():
    up = Upstreams()
    loads = AdapterLoads(up, per_minute=10, timeout=5)
    tenant = Tenant(name="t")
    sent = time.monotonic()
    await loads.load(tenant, ROUTE, PICK, sent)
    # Sent before that load finished: it crossed it.
    await loads.load(tenant, ROUTE, PICK, sent)
    assert up.stub.loads == ["a"]
    # Sent after it: the adapter went again, load it again.
    await loads.load(tenant, ROUTE, PICK, time.monotonic())
    assert up.stub.loads == ["a", "a"]


async def test_the_bucket_refills_at_the_tenants_rate(monkeypatch):
    now = [1000.0]
    # The module's clock only: the event loop keeps the real one.
    monkeypatch.setattr(adapter_loads, "time", SimpleNamespace(monotonic=lambda: now[0]))
    loads = AdapterLoads(Upstreams(), per_minute=10, timeout=5)
    tenant = Tenant(name="t", adapter_loads_per_minute=1)
    await loads.load(tenant, ROUTE, PICK, now[0])
    now[0] += 1
    with pytest.raises(APIError) as caught:
        await loads.load(tenant, ROUTE, PICK, now[0])
    assert caught.value.headers["Retry-After"] == "59"
    now[0] += 59
    await loads.load(tenant, ROUTE, PICK, now[0])
