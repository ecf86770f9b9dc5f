"""/v1/files and /v1/batches over the gateway's real HTTP app, on the stub cluster.

Tenants with keys in the real Redis, files and batches in a real SQLite file
and a real folder in the test's tmp_path, requests through httpx's ASGI
transport, and a batch worker (BatchWorker) on the cluster's pipeline.
"""

import json
import uuid
from dataclasses import dataclass

import httpx

from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import UsageEvent
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.tenants import TenantStore
from maas_services.gateway.batches.file_store import FileLimits
from maas_services.gateway.batches.service import BatchService
from maas_services.gateway.batches.worker import BatchWorker, WorkerSettings
from maas_services.gateway.http_api.http_app import create_app
from maas_services.gateway.http_api.routes.deps import Gateway
from tests.integration.gateway.usage_stream import usage_events


def jsonl(requests: list[dict]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in requests)


def chat_line(custom_id: str, model: str, content: str = "Hi", **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": content}], **body},
    }


def embedding_line(custom_id: str, model: str, input, **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": model, "input": input, **body},
    }


@dataclass
class BatchesApi:
    client: httpx.AsyncClient
    service: BatchService
    keys: dict[str, str]  # tenant name -> key
    redis_url: str
    pipeline: object
    redis: object

    @property
    def tenants(self) -> list[str]:
        return list(self.keys)

    def auth(self, tenant: str | None = None) -> dict:
        return {"authorization": f"Bearer {self.keys[tenant or self.tenants[0]]}"}

    async def upload(
        self, content, tenant: str | None = None, purpose: str = "batch"
    ) -> httpx.Response:
        return await self.client.post(
            "/v1/files",
            data={"purpose": purpose},
            files={"file": ("input.jsonl", content, "application/jsonl")},
            headers=self.auth(tenant),
        )

    async def create_batch(self, tenant: str | None = None, **body) -> httpx.Response:
        body = {"endpoint": "/v1/chat/completions", "completion_window": "24h", **body}
        return await self.client.post("/v1/batches", json=body, headers=self.auth(tenant))

    async def get(self, path: str, tenant: str | None = None) -> httpx.Response:
        return await self.client.get(path, headers=self.auth(tenant))

    def worker(self, **settings) -> BatchWorker:
        settings = {"concurrency": 2, "poll_seconds": 0.05, **settings}
        return BatchWorker(
            self.service.batches,
            self.service.files,
            self.pipeline,
            TenantStore(self.redis),
            WorkerSettings(**settings),
        )

    async def usage_events(self, tenant: str | None = None) -> list[UsageEvent]:
        return await usage_events(self.redis_url, tenant or self.tenants[0])


async def open_batches_api(
    pipeline, redis_url: str, tmp_path, limits: FileLimits | None = None, tenants: int = 2
):
    """(the api, a closer): the app over `pipeline`, `tenants` fresh tenants."""
    redis = open_redis(redis_url)
    store = TenantStore(redis)
    keys = {}
    for _ in range(tenants):
        tenant = await store.create_tenant(f"batch-{uuid.uuid4().hex[:8]}")
        keys[tenant.name] = (await store.create_key(tenant.name))[1]
    service = await BatchService.open(
        f"sqlite+aiosqlite:///{tmp_path}/batches.db",
        str(tmp_path / "files"),
        limits or FileLimits(),
        read_timeout=30.0,
    )
    gateway = Gateway(pipeline, Authenticator(store), redis, 4 << 20, batch_service=service)
    transport = httpx.ASGITransport(app=create_app(gateway))
    client = httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=60)

    async def close():
        await client.aclose()
        await service.close()
        await redis.aclose()

    return BatchesApi(client, service, keys, redis_url, pipeline, redis), close
