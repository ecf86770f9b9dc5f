"""/v1/responses over the gateway's real HTTP app, on the stub cluster, with a real store.

Two tenants with their keys in the real Redis; the store a real SQLite file
in the test's folder; requests through httpx's ASGI transport.
"""

import json
import uuid
from dataclasses import dataclass

import httpx

from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.tenants import TenantStore
from maas_services.gateway.http_api.http_app import create_app
from maas_services.gateway.http_api.routes.deps import Gateway
from maas_services.gateway.responses.store import ResponseStore, StoreLimits


@dataclass
class ResponsesApi:
    client: httpx.AsyncClient
    store: ResponseStore
    keys: dict[str, str]  # tenant name -> key
    cluster: object

    @property
    def tenants(self) -> list[str]:
        return list(self.keys)

    def _auth(self, tenant: str | None) -> dict:
        return {"authorization": f"Bearer {self.keys[tenant or self.tenants[0]]}"}

    async def create(self, tenant: str | None = None, **body) -> httpx.Response:
        response = await self.client.post("/v1/responses", json=body, headers=self._auth(tenant))
        await self.cluster.pipeline.background.wait()
        return response

    async def get(self, response_id: str, tenant: str | None = None) -> httpx.Response:
        return await self.client.get(f"/v1/responses/{response_id}", headers=self._auth(tenant))

    async def delete(self, response_id: str, tenant: str | None = None) -> httpx.Response:
        return await self.client.delete(f"/v1/responses/{response_id}", headers=self._auth(tenant))


def events(response: httpx.Response) -> list[dict]:
    """A stream's typed events, each checked against its SSE event name."""
    assert response.status_code == 200, response.text
    parsed, name = [], None
    for line in response.text.splitlines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            event = json.loads(line[6:])
            assert event["type"] == name
            parsed.append(event)
    return parsed


async def open_api(cluster, redis_url: str, database: str, limits: StoreLimits, tenants: int = 2):
    """(the api, a closer): the app over the cluster's pipeline, `tenants` fresh tenants."""
    redis = open_redis(redis_url)
    store = TenantStore(redis)
    keys = {}
    for _ in range(tenants):
        tenant = await store.create_tenant(f"resp-{uuid.uuid4().hex[:8]}")
        keys[tenant.name] = (await store.create_key(tenant.name))[1]
    responses = await ResponseStore.open(database, limits)
    gateway = Gateway(cluster.pipeline, Authenticator(store), redis, 4 << 20, responses=responses)
    transport = httpx.ASGITransport(app=create_app(gateway))
    client = httpx.AsyncClient(transport=transport, base_url="http://gw")

    async def close():
        await client.aclose()
        await responses.close()
        await redis.aclose()

    return ResponsesApi(client, responses, keys, cluster), close
