"""Requests held at gateways count in the pool's queue depth (scale to zero, #17)."""

from maas.v1 import router_pb2
from services.router.held import HeldRequests


async def test_held_requests_reach_the_pool_stats_of_a_model_with_no_replica(cluster):
    router = await cluster.router(engines=[])
    for gateway, held in (("gw-a", {"m": 2, "other": 1}), ("gw-b", {"m": 3})):
        await router.stub.ReportHeld(
            router_pb2.HeldReport(gateway_id=gateway, held=held, ttl_seconds=30)
        )
    stats = await router.stats()
    assert (stats.held, stats.queue_depth, stats.ready_replicas) == (5, 5, 0)
    # A report replaces that gateway's last one: gw-a's requests were served.
    await router.stub.ReportHeld(router_pb2.HeldReport(gateway_id="gw-a", ttl_seconds=30))
    assert (await router.stats()).held == 3


def test_a_report_lapses_after_its_ttl():
    now = [100.0]
    held = HeldRequests(clock=lambda: now[0])
    held.report("gw", {"m": 4}, ttl_seconds=5)
    assert held.held("m") == 4
    now[0] = 105.0
    assert held.held("m") == 0
