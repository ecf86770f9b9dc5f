"""A fresh tenant and key in the stack's Redis, for tests that must not share `dev`."""

import uuid

from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.tenants import TenantStore


async def new_tenant_key(redis_url: str, prefix: str = "t") -> tuple[str, str]:
    redis = open_redis(redis_url)
    try:
        store = TenantStore(redis)
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        await store.create_tenant(name)
        return name, (await store.create_key(name))[1]
    finally:
        await redis.aclose()
