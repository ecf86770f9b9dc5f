"""Requests held while a deployment scaled to zero starts a replica (#17).

The hold reports to a real router over gRPC; the catalog is a plain function
the test flips from no replica to a ready one.
"""

import asyncio

import grpc
import pytest

from maas.v1 import engine_pb2_grpc, router_pb2, router_pb2_grpc
from maas_services.common.openai_api.errors import APIError
from maas_services.gateway.admission.cold_start_hold import ColdStartHold, HoldLimits
from maas_services.router.server import start
from maas_services.router.settings import RouterSettings
from tests.integration.gateway.conftest import CHUNKS, MODEL
from tests.integration.gateway.stubs import StubEngine
from tests.integration.gateway.stubs import start as start_stub

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def router():
    handle, pool = await start(RouterSettings(engines=[], poll_interval_seconds=0.1))
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{handle.port}")
    yield router_pb2_grpc.RouterStub(channel)
    await channel.close()
    await handle.server.stop(None)
    await pool.close()


class Catalog:
    def __init__(self):
        self.ready_replicas = 0

    async def __call__(self):
        replicas = [router_pb2.ReplicaStats(endpoint_id="e", ready=True)] * self.ready_replicas
        stats = router_pb2.DeploymentStats(
            model="cold", ready_replicas=self.ready_replicas, replicas=replicas
        )
        return {"cold": stats}


async def held_at_router(router) -> int:
    stats = await router.GetPoolStats(router_pb2.PoolStatsRequest(model="cold"))
    return stats.deployments[0].held


async def wait_for(check, what: str):
    for _ in range(200):
        if await check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def test_held_requests_are_reported_and_served_once_a_replica_is_ready(router):
    catalog = Catalog()
    hold = ColdStartHold(catalog, router.ReportHeld, HoldLimits(poll_seconds=0.02))
    try:
        waiting = [asyncio.create_task(hold.until_ready("cold", "t")) for _ in range(3)]
        await wait_for(lambda: _eq(held_at_router(router), 3), "3 held at the router")
        assert not any(task.done() for task in waiting)
        catalog.ready_replicas = 1
        served = await asyncio.gather(*waiting)
        assert all(stats["cold"].ready_replicas == 1 for stats in served)
        await wait_for(lambda: _eq(held_at_router(router), 0), "the holds withdrawn")
    finally:
        await hold.close()


async def test_holds_that_end_during_a_report_in_flight_are_withdrawn(router):
    """Every hold ends while a report counting them is on the wire: one more follows."""
    catalog = Catalog()
    in_flight, go_on, stale_landed = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def slow_report(report):
        if not report.held:
            return await router.ReportHeld(report)
        in_flight.set()
        await go_on.wait()
        answer = await router.ReportHeld(report)
        stale_landed.set()
        return answer

    hold = ColdStartHold(catalog, slow_report, HoldLimits(poll_seconds=0.01))
    try:
        waiting = asyncio.create_task(hold.until_ready("cold", "t"))
        await in_flight.wait()
        catalog.ready_replicas = 1
        await waiting
        assert not hold.held
        go_on.set()  # the report of one held lands after the hold ended
        await stale_landed.wait()
        await wait_for(lambda: _eq(held_at_router(router), 0), "the hold withdrawn")
    finally:
        await hold.close()


async def test_past_the_limits_503_with_retry_after_from_the_observed_cold_start(router):
    catalog = Catalog()
    now = [0.0]
    limits = HoldLimits(max_held=1, timeout_seconds=30, poll_seconds=0.01)
    hold = ColdStartHold(catalog, router.ReportHeld, limits, clock=lambda: now[0])
    try:
        first = asyncio.create_task(hold.until_ready("cold", "t"))
        await wait_for(lambda: _eq(held_at_router(router), 1), "one held")
        # The queue for this deployment is full: refused at once, no cold start seen yet.
        with pytest.raises(APIError) as full:
            await hold.until_ready("cold", "t")
        assert full.value.status == 503 and full.value.headers["Retry-After"] == "30"
        now[0] = 45.0  # the replica took 45 s
        catalog.ready_replicas = 1
        await first

        catalog.ready_replicas = 0  # scaled to zero again; the next cold start is as slow
        second = asyncio.create_task(hold.until_ready("cold", "t"))
        await wait_for(lambda: _eq(held_at_router(router), 1), "held again")
        now[0] = 75.0  # 30 s in: past the hold limit
        with pytest.raises(APIError) as late:
            await second
        assert late.value.status == 503
        # 45 s observed, 30 s of it already run: try again in 15.
        assert late.value.headers["Retry-After"] == "15"
    finally:
        await hold.close()


async def test_one_tenant_fills_only_its_share_of_the_holds(router):
    limits = HoldLimits(max_held=4, max_held_per_tenant=2, poll_seconds=0.01)
    hold = ColdStartHold(Catalog(), router.ReportHeld, limits)
    try:
        greedy = [asyncio.create_task(hold.until_ready("cold", "greedy")) for _ in range(2)]
        await wait_for(lambda: _eq(held_at_router(router), 2), "the greedy tenant's two")
        # The worst case: it keeps asking; each extra request is refused at once.
        for _ in range(10):
            with pytest.raises(APIError) as refused:
                await hold.until_ready("cold", "greedy")
            assert refused.value.status == 503 and "2 of them yours" in refused.value.message
        other = asyncio.create_task(hold.until_ready("cold", "other"))
        await wait_for(lambda: _eq(held_at_router(router), 3), "the other tenant held")
        assert not other.done()
    finally:
        for task in [*greedy, other]:
            task.cancel()
        await hold.close()


async def _eq(value, expected) -> bool:
    return await value == expected


ROUTES = "deployments:\n  stub-model: {scales_to_zero: true}\n"


async def test_the_pipeline_holds_a_request_until_a_replica_is_ready(make_cluster):
    cluster = await make_cluster(replicas=0, routes=ROUTES)
    request = asyncio.create_task(cluster.run())
    await asyncio.sleep(0.3)
    assert not request.done() and cluster.pipeline.hold.held["stub-model"] == 1
    engine = StubEngine(MODEL, list(CHUNKS), 0.0)
    server, address = await start_stub(engine, engine_pb2_grpc.add_EngineServicer_to_server)
    try:
        cluster.router.endpoints.append(("e0", address, MODEL))
        deltas = await asyncio.wait_for(request, 10)
        assert "".join(d.text for d in deltas) == "".join(CHUNKS)
    finally:
        await server.stop(0)


async def test_the_pipeline_answers_503_with_retry_after_past_the_hold_limit(make_cluster):
    cluster = await make_cluster(replicas=0, routes=ROUTES, hold_timeout_seconds=0.3)
    with pytest.raises(APIError) as refused:
        await cluster.run()
    assert refused.value.status == 503 and refused.value.headers["Retry-After"] == "1"
    # Without scales_to_zero the old answer stands: no deployment running.
    plain = await make_cluster(replicas=0)
    with pytest.raises(APIError) as unknown:
        await plain.run()
    assert unknown.value.status == 404
