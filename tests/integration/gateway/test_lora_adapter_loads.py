"""On-demand adapter loads: a replica that lacks the adapter loads it and serves the
request; the loads are bounded per tenant, so one tenant's many new adapters cost
only that tenant (429 with Retry-After) while others are served."""

import asyncio
import uuid
from dataclasses import replace

import pytest

from maas_services.common.openai_api.errors import DROPPED_REASON_HEADER, APIError
from maas_services.gateway.admission.tenants import Principal, Tenant
from maas_services.gateway.upstream.adapter_loads import BUSY_REASON, RATE_REASON
from tests.integration.gateway.conftest import MODEL, parsed, read_as_a_front

ADAPTERS = 8


def routes(greedy: str, other: str) -> str:
    """ADAPTERS on-demand adapters of `greedy`'s, one of `other`'s."""
    entries = "".join(
        f"  {greedy}-{i}: {{deployment: {MODEL}, source: /adapters/{i}, tenants: [{greedy}]}}\n"
        for i in range(ADAPTERS)
    )
    return f"""
deployments:
  {MODEL}: {{}}
adapters:
{entries}  {other}-own: {{deployment: {MODEL}, source: /adapters/own, tenants: [{other}]}}
"""


def tenant(**limits) -> Tenant:
    return Tenant(name=f"loads-{uuid.uuid4().hex[:8]}", **limits)


async def run(cluster, who: Tenant, model: str) -> str:
    request = replace(parsed(), model=model)
    run = await cluster.pipeline.admit(Principal(who, "key_test"), request)
    return "".join([d.text async for d in read_as_a_front(run)])


async def until(condition, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_a_missing_adapter_is_loaded_once_and_the_request_served(make_cluster):
    greedy, other = tenant(), tenant()
    cluster = await make_cluster(replicas=1, routes=routes(greedy.name, other.name))
    engine = cluster.engines[0]
    assert await run(cluster, greedy, f"{greedy.name}-0")
    assert engine.loads == [(f"{greedy.name}-0", "/adapters/0")]
    assert engine.adapters_served == [f"{greedy.name}-0"]
    assert await run(cluster, greedy, f"{greedy.name}-0")
    assert len(engine.loads) == 1


async def test_a_burst_on_one_new_adapter_costs_one_load(make_cluster):
    greedy, other = tenant(), tenant()
    cluster = await make_cluster(replicas=1, routes=routes(greedy.name, other.name))
    engine = cluster.engines[0]
    engine.load_gate = asyncio.Event()
    burst = [asyncio.create_task(run(cluster, greedy, f"{greedy.name}-3")) for _ in range(6)]
    await until(lambda: engine.loads)
    engine.load_gate.set()
    assert all(await asyncio.gather(*burst))
    assert engine.loads == [(f"{greedy.name}-3", "/adapters/3")]


async def test_many_new_adapters_at_once_cost_only_their_tenant(make_cluster):
    greedy, other = tenant(), tenant()
    cluster = await make_cluster(replicas=1, routes=routes(greedy.name, other.name))
    engine = cluster.engines[0]
    engine.load_gate = asyncio.Event()
    asked = [
        asyncio.create_task(run(cluster, greedy, f"{greedy.name}-{i}")) for i in range(ADAPTERS)
    ]
    # One load in flight for the tenant; every other adapter is refused at once.
    await until(lambda: sum(t.done() for t in asked) == ADAPTERS - 1)
    # The admitted load may still be on its way to the engine when the rest are refused.
    await until(lambda: len(engine.loads) >= 1)
    assert len(engine.loads) == 1
    (loading,) = [t for t in asked if not t.done()]
    refused = [t.exception() for t in asked if t is not loading]
    assert all(isinstance(e, APIError) and e.status == 429 for e in refused)
    assert {e.headers[DROPPED_REASON_HEADER] for e in refused} == {BUSY_REASON}
    assert all(int(e.headers["Retry-After"]) >= 1 for e in refused)
    # Meanwhile another tenant is served, and its own adapter's load is not refused.
    assert await run(cluster, other, MODEL)
    own = asyncio.create_task(run(cluster, other, f"{other.name}-own"))
    await until(lambda: len(engine.loads) == 2)
    engine.load_gate.set()
    assert await own
    assert await loading


async def test_loads_past_the_tenants_rate_are_refused_with_retry_after(make_cluster):
    greedy, other = tenant(adapter_loads_per_minute=2), tenant()
    cluster = await make_cluster(replicas=1, routes=routes(greedy.name, other.name))
    assert await run(cluster, greedy, f"{greedy.name}-0")
    assert await run(cluster, greedy, f"{greedy.name}-1")
    with pytest.raises(APIError) as caught:
        await run(cluster, greedy, f"{greedy.name}-2")
    assert (caught.value.status, caught.value.code) == (429, "rate_limit_exceeded")
    assert caught.value.headers[DROPPED_REASON_HEADER] == RATE_REASON
    # The first of the minute's two loads leaves the window within a minute.
    assert 1 <= int(caught.value.headers["Retry-After"]) <= 60
    # Adapters already loaded still serve it, and the other tenant loads its own.
    assert await run(cluster, greedy, f"{greedy.name}-1")
    assert await run(cluster, other, f"{other.name}-own")
    assert len(cluster.engines[0].loads) == 3
