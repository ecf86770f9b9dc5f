"""Over HTTP, a tenant the limiter still refuses for RPM is answered before its body is read."""

import uuid

import httpx

from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.tenants import TenantStore
from maas_services.gateway.http_api.http_app import create_app
from maas_services.gateway.http_api.routes.deps import Gateway
from tests.integration.gateway.conftest import MODEL


async def test_a_blocked_tenants_body_is_never_parsed(make_cluster, redis_url):
    cluster = await make_cluster(replicas=1)
    redis = open_redis(redis_url)
    try:
        store = TenantStore(redis)
        tenant = await store.create_tenant(f"gate-{uuid.uuid4().hex[:8]}", rpm=1)
        _, api_key = await store.create_key(tenant.name)
        app = create_app(Gateway(cluster.pipeline, Authenticator(store), redis, 1 << 20))
        headers = {"authorization": f"Bearer {api_key}"}
        body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            served = await client.post("/v1/completions", json=body, headers=headers)
            # The limiter's script refuses this one and the gateway remembers it.
            counted = await client.post("/v1/completions", json=body, headers=headers)
            shed = await client.post("/v1/completions", content=b"{not json", headers=headers)
        await cluster.pipeline.background.wait()
    finally:
        await redis.aclose()
    assert (served.status_code, counted.status_code) == (200, 429)
    # Not the 400 a parsed body would get.
    assert shed.status_code == 429
    assert shed.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(shed.headers["retry-after"]) >= 1
