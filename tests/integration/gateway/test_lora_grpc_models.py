"""gRPC ListModels answers what GET /v1/models answers for the same key: the same names,
each adapter with its parent; a private adapter is listed to its owner only."""

import grpc
import httpx

from maas.v1 import gateway_pb2, gateway_pb2_grpc
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.grpc_api.grpc_front import start_grpc_front
from maas_services.gateway.http_api.http_app import create_app
from maas_services.gateway.http_api.routes.deps import Gateway
from maas_services.gateway.settings import GatewaySettings
from tests.integration.gateway.conftest import MODEL
from tests.integration.gateway.test_lora_fronts import keys, routes  # noqa: F401

SHARED = "flag-loaded"  # an adapter an engine was started with: every tenant's


async def test_grpc_lists_the_models_and_parents_http_lists(make_cluster, keys, redis_url):  # noqa: F811
    owner, owner_key, other_key, store, redis = keys
    private = f"private-{owner}"
    cluster = await make_cluster(replicas=1, routes=routes(owner))
    cluster.router.adapters[MODEL] = [private, SHARED]
    auth = Authenticator(store)
    app = create_app(Gateway(cluster.pipeline, auth, redis, 1 << 20))
    handle = await start_grpc_front(GatewaySettings(redis_url=redis_url), cluster.pipeline, auth)
    listings = {}
    try:
        async with (
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as web,
            grpc.aio.insecure_channel(f"127.0.0.1:{handle.port}") as channel,
        ):
            stub = gateway_pb2_grpc.GatewayStub(channel)
            for key in (owner_key, other_key):
                reply = await stub.ListModels(
                    gateway_pb2.ListModelsRequest(),
                    metadata=[("authorization", f"Bearer {key}")],
                )
                answer = await web.get("/v1/models", headers={"authorization": f"Bearer {key}"})
                over_http = {m["id"]: m.get("parent", "") for m in answer.json()["data"]}
                listings[key] = {m.id: m.parent for m in reply.models}
                assert listings[key] == over_http
    finally:
        await handle.server.stop(0)
    assert listings[owner_key] == {MODEL: "", private: MODEL, SHARED: MODEL}
    assert listings[other_key] == {MODEL: "", SHARED: MODEL}
