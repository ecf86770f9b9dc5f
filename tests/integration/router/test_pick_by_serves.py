"""A request is picked only onto replicas that serve what it needs.

A deployment's replicas can differ in what they serve (LoadReport.serves) while
a rollout moves it from generation to embeddings: PickRequest.serve keeps an
embedding off a replica that would refuse it, and a generation off an
embedding-only one.
"""

import grpc
import pytest

from maas.v1 import router_pb2
from tests.integration.router.conftest import eventually


async def pick(router, serve: str) -> str:
    reply = await router.stub.Pick(
        router_pb2.PickRequest(request_id="r", model="m", token_ids=[1, 2, 3], serve=serve)
    )
    return reply.endpoint_id


async def test_each_request_goes_to_a_replica_that_serves_it(cluster):
    generator = await cluster.engine("gen")
    embedder = await cluster.engine("emb")
    embedder.load.serves[:] = ["embed"]
    both = await cluster.engine("both")
    both.load.serves[:] = ["generate", "embed"]
    router = await cluster.router(routing_policy="least_load")
    await eventually(
        lambda: (
            all(e.ready for e in router.pool.endpoints.values())
            and router.pool.endpoints["emb"].serves == ("embed",)
        ),
        what="three reachable, their serves known",
    )
    assert generator.load.serves == []  # an engine from before the field: generation
    assert {await pick(router, "embed") for _ in range(12)} == {"emb", "both"}
    assert {await pick(router, "generate") for _ in range(12)} == {"gen", "both"}
    assert {await pick(router, "") for _ in range(12)} == {"gen", "both"}


async def test_no_replica_that_serves_it_is_unavailable_naming_what(cluster):
    await cluster.engine("gen")
    router = await cluster.router()
    await eventually(lambda: router.pool.endpoints["gen"].ready, what="gen reachable")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await pick(router, "embed")
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "'embed'" in caught.value.details()
