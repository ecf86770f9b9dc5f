"""A pick counts on its replica until the replica's next load report, which
ends it: the gateway sends the router nothing after a request."""

from maas.v1 import router_pb2
from tests.integration.router.conftest import eventually


async def test_the_engines_next_load_report_ends_a_pick_without_a_release(cluster):
    engine = await cluster.engine("e0")
    router = await cluster.router()
    await eventually(lambda: router.pool.endpoints["e0"].ready, what="e0 reachable")
    reply = await router.stub.Pick(
        router_pb2.PickRequest(request_id="r1", model="m", token_ids=[1, 2, 3], tenant="t")
    )
    assert reply.endpoint_id == "e0"
    engine.load.running = 1  # the request reached the engine: its reports count it

    async def reported_by_the_engine_only() -> bool:
        replica = (await router.stats()).replicas[0]
        return replica.in_flight == 0 and replica.running == 1

    await eventually(reported_by_the_engine_only, what="the pick ended by a load report")
    assert router.pool.endpoints["e0"].requests == 1


async def test_an_older_gateways_release_is_answered_and_changes_nothing(cluster):
    engine = await cluster.engine("e0")
    router = await cluster.router()
    await eventually(lambda: router.pool.endpoints["e0"].ready, what="e0 reachable")
    engine.load.waiting = 2
    await eventually(lambda: router.pool.endpoints["e0"].requests == 2, what="a report")
    await router.stub.Release(router_pb2.ReleaseRequest(request_id="never-picked"))
    assert router.pool.endpoints["e0"].requests == 2
