"""One route family on an app of its own: the routers need only a Gateway on app.state."""

import uuid

import httpx
from fastapi import FastAPI

from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.tenants import TenantStore
from maas_services.gateway.http_api.routes import health, models
from maas_services.gateway.http_api.routes.deps import Gateway
from tests.integration.gateway.conftest import MODEL


async def test_the_models_and_health_routers_serve_without_the_rest_of_the_app(
    make_cluster, redis_url
):
    cluster = await make_cluster(replicas=1)
    redis = open_redis(redis_url)
    try:
        store = TenantStore(redis)
        tenant = await store.create_tenant(f"alone-{uuid.uuid4().hex[:8]}")
        _, api_key = await store.create_key(tenant.name)
        app = FastAPI()
        app.state.gateway = Gateway(cluster.pipeline, Authenticator(store), redis, 1 << 20)
        app.include_router(models.router)
        app.include_router(health.router)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            listed = await client.get("/v1/models", headers={"authorization": f"Bearer {api_key}"})
            ready = await client.get("/readyz")
    finally:
        await redis.aclose()
    assert [m["id"] for m in listed.json()["data"]] == [MODEL]
    assert ready.json() == {"status": "ready"}
