"""A tenant's private adapter over both fronts: its owner lists it (with its parent) and
is served; another key neither lists nor reaches it (HTTP 404, gRPC NOT_FOUND)."""

import uuid

import grpc
import httpx
import pytest

from maas.v1 import gateway_pb2, gateway_pb2_grpc, tokenizer_pb2
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.tenants import TenantStore
from maas_services.gateway.grpc_api.grpc_front import start_grpc_front
from maas_services.gateway.http_api.http_app import create_app
from maas_services.gateway.http_api.routes.deps import Gateway
from maas_services.gateway.settings import GatewaySettings
from tests.integration.gateway.conftest import MODEL


def routes(owner: str) -> str:
    return f"""
deployments:
  {MODEL}: {{}}
adapters:
  private-{owner}: {{deployment: {MODEL}, source: /adapters/private, tenants: [{owner}]}}
"""


@pytest.fixture
async def keys(redis_url):
    """(owner's name, owner's key, another tenant's key), their store and its Redis."""
    redis = open_redis(redis_url)
    store = TenantStore(redis)
    owner = await store.create_tenant(f"front-{uuid.uuid4().hex[:8]}")
    other = await store.create_tenant(f"front-{uuid.uuid4().hex[:8]}")
    _, owner_key = await store.create_key(owner.name)
    _, other_key = await store.create_key(other.name)
    yield owner.name, owner_key, other_key, store, redis
    await redis.aclose()


async def test_http_lists_and_serves_the_adapter_to_its_owner_only(make_cluster, keys):
    owner, owner_key, other_key, store, redis = keys
    cluster = await make_cluster(replicas=1, routes=routes(owner))
    cluster.engines[0].adapters.add(f"private-{owner}")
    adapter = f"private-{owner}"
    app = create_app(Gateway(cluster.pipeline, Authenticator(store), redis, 1 << 20))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:

        async def call(method: str, path: str, key: str, **body) -> httpx.Response:
            headers = {"authorization": f"Bearer {key}"}
            return await client.request(method, path, headers=headers, json=body or None)

        listed = (await call("GET", "/v1/models", owner_key)).json()["data"]
        assert {m["id"]: m.get("parent") for m in listed} == {MODEL: None, adapter: MODEL}
        assert (await call("GET", f"/v1/models/{adapter}", owner_key)).json()["parent"] == MODEL
        chat = {"model": adapter, "messages": [{"role": "user", "content": "Hi"}]}
        served = await call("POST", "/v1/chat/completions", owner_key, **chat)
        assert served.status_code == 200, served.text
        assert served.json()["model"] == adapter
        listed = (await call("GET", "/v1/models", other_key)).json()["data"]
        assert [m["id"] for m in listed] == [MODEL]
        refusals = [
            await call("GET", f"/v1/models/{adapter}", other_key),
            await call("POST", "/v1/chat/completions", other_key, **chat),
            await call("POST", "/v1/completions", other_key, model=adapter, prompt="Hi"),
            await call("POST", "/v1/embeddings", other_key, model=adapter, input="Hi"),
        ]
    await cluster.pipeline.background.wait()
    for refused in refusals:
        assert refused.status_code == 404, refused.text
        assert refused.json()["error"]["code"] == "model_not_found"
    assert cluster.engines[0].adapters_served == [adapter]


async def test_grpc_lists_and_serves_the_adapter_to_its_owner_only(make_cluster, keys, redis_url):
    owner, owner_key, other_key, store, _ = keys
    cluster = await make_cluster(replicas=1, routes=routes(owner))
    cluster.engines[0].adapters.add(f"private-{owner}")
    adapter = f"private-{owner}"
    handle = await start_grpc_front(
        GatewaySettings(redis_url=redis_url), cluster.pipeline, Authenticator(store)
    )
    request = gateway_pb2.ChatCompletionRequest(
        model=adapter, messages=[tokenizer_pb2.ChatMessage(role="user", content="Hi")]
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{handle.port}") as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            as_owner = [("authorization", f"Bearer {owner_key}")]
            as_other = [("authorization", f"Bearer {other_key}")]
            owned = await stub.ListModels(gateway_pb2.ListModelsRequest(), metadata=as_owner)
            assert sorted(m.id for m in owned.models) == sorted([MODEL, adapter])
            chunks = [c async for c in stub.ChatCompletion(request, metadata=as_owner)]
            assert "".join(c.text for c in chunks)
            theirs = await stub.ListModels(gateway_pb2.ListModelsRequest(), metadata=as_other)
            assert [m.id for m in theirs.models] == [MODEL]
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                [c async for c in stub.ChatCompletion(request, metadata=as_other)]
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            assert "does not exist or you do not have access" in caught.value.details()
    finally:
        await handle.server.stop(0)
        await cluster.pipeline.background.wait()
    assert cluster.engines[0].adapters_served == [adapter]
