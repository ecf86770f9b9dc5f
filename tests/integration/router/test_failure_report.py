"""A gateway's word that a replica failed under a request takes it out of picking at once.

Release with success=false (engine_client.py sends it when a stream breaks and
migrates): the replica is skipped from the next Pick, without waiting for a
poll to fail, and comes back with its next load report.
"""

import grpc
import pytest

from maas.v1 import router_pb2
from tests.integration.router.conftest import eventually


async def test_a_reported_failure_takes_the_replica_out_until_its_next_report(cluster):
    await cluster.engine("e0")
    await cluster.engine("e1")
    # Polls far apart: only the report can take e0 out within the test.
    router = await cluster.router(routing_policy="least_load", poll_interval_seconds=30)
    await eventually(
        lambda: all(e.ready for e in router.pool.endpoints.values()), what="both reachable"
    )
    await router.stub.Release(
        router_pb2.ReleaseRequest(request_id="r1", endpoint_id="e0", success=False)
    )
    assert {await router.pick([1, 2, 3]) for _ in range(6)} == {"e1"}
    await router.stub.Release(
        router_pb2.ReleaseRequest(request_id="r2", endpoint_id="e1", success=False)
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await router.pick([1, 2, 3])
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE

    # The replica's next load report brings it back.
    await router.pool._links["e0"].poll_once()
    assert await router.pick([1, 2, 3]) == "e0"


async def test_a_successful_release_changes_nothing(cluster):
    await cluster.engine("e0")
    router = await cluster.router(poll_interval_seconds=30)
    await eventually(lambda: router.pool.endpoints["e0"].ready, what="e0 reachable")
    await router.stub.Release(
        router_pb2.ReleaseRequest(request_id="r1", endpoint_id="e0", success=True)
    )
    assert await router.pick([1, 2, 3]) == "e0"
