"""An internal gRPC server demands the service token; health and reflection stay open.

A real router (in process, MAAS_SERVICE_TOKEN set as the chart and `maas up` set
it) over a fake engine, called on loopback: without the token or with a wrong
one, UNAUTHENTICATED; through maas_services.common.grpc_client, which sends the
process's token, the call goes through.
"""

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from maas.v1 import router_pb2, router_pb2_grpc
from maas_services.common.grpc_client import open_channel
from maas_services.common.service_token import ENV, METADATA_KEY

TOKEN = "release-token"
PICK = router_pb2.PickRequest(request_id="r1", model="m", token_ids=[1, 2, 3], tenant="t")


@pytest.fixture
async def router(cluster, monkeypatch):
    monkeypatch.setenv(ENV, TOKEN)
    await cluster.engine("e0")
    router = await cluster.router()
    return f"127.0.0.1:{router.handle.port}"


@pytest.mark.parametrize("metadata", [(), ((METADATA_KEY, "guessed"),)], ids=["none", "wrong"])
async def test_a_call_without_the_token_is_unauthenticated(router, metadata):
    async with grpc.aio.insecure_channel(router) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        for call in (
            stub.Pick(PICK, metadata=metadata),
            stub.GetPoolStats(router_pb2.PoolStatsRequest(), metadata=metadata),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_health_and_reflection_need_no_token(router):
    async with grpc.aio.insecure_channel(router) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = [s.name async for r in replies for s in r.list_services_response.service]
    assert "maas.v1.Router" in names


async def test_internal_clients_send_the_token(router):
    channel = open_channel(router, "test")
    try:
        reply = await router_pb2_grpc.RouterStub(channel).Pick(PICK)
    finally:
        await channel.close()
    assert reply.endpoint_id == "e0"


async def test_a_refused_call_and_an_admitted_one_never_share_a_handler(router):
    # The metrics interceptor keeps one wrapped handler per method and handler:
    # calls without the token, between and after admitted ones, stay refused.
    channel = open_channel(router, "test")
    try:
        async with grpc.aio.insecure_channel(router) as bare:
            admitted = router_pb2_grpc.RouterStub(channel)
            outsider = router_pb2_grpc.RouterStub(bare)
            for _ in range(2):
                assert (await admitted.Pick(PICK)).endpoint_id == "e0"
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await outsider.Pick(PICK)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await channel.close()
