"""Requests held at gateways count in the pool's queue depth (scale to zero, #17)."""

import grpc
import pytest

from maas.v1 import router_pb2
from maas_services.router import held as caps
from maas_services.router.held import HeldRequests


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


async def test_a_report_over_a_cap_is_refused_whole(cluster):
    router = await cluster.router(engines=[])
    too_many = {f"m{i}": 1 for i in range(caps.MAX_MODELS + 1)}
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await router.stub.ReportHeld(
            router_pb2.HeldReport(gateway_id="gw", held=too_many, ttl_seconds=30)
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (await router.stats()).held == 0


def test_a_hostile_report_stays_bounded():
    now = [0.0]
    held = HeldRequests(clock=lambda: now[0])
    # The largest counts every gateway may send still fit the stats' int32.
    for g in range(caps.MAX_GATEWAYS):
        held.report(f"gw-{g}", {"m": 2**31 - 1}, ttl_seconds=float("inf"))
    assert held.held("m") == caps.MAX_GATEWAYS * caps.MAX_HELD < 2**31 - 1
    with pytest.raises(caps.HeldReportRefused):
        held.report("one-more", {"m": 1}, ttl_seconds=5)
    held.report("gw-0", {"m": 1}, ttl_seconds=5)  # a known gateway still replaces its report
    # An infinite or NaN TTL lapses like any other, at most MAX_TTL_SECONDS on.
    now[0] = caps.MAX_TTL_SECONDS
    assert held.held("m") == 0
    held.report("gw-nan", {"m": 3}, ttl_seconds=float("nan"))
    assert held.held("m") == 0
