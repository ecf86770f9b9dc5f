"""Under fail_open an unreachable Redis serves cached keys for a bounded time only."""

import asyncio
import uuid

import pytest

from maas_services.common.openai_api.errors import APIError
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.tenants import TenantStore
from tests.integration.gateway.private_redis import private_redis


async def test_a_cached_key_older_than_max_stale_is_refused_like_an_unknown_one(tmp_path):
    async with private_redis(tmp_path) as (url, process):
        redis = open_redis(url)
        try:
            store = TenantStore(redis)
            tenant = await store.create_tenant(f"stale-{uuid.uuid4().hex[:8]}")
            _, api_key = await store.create_key(tenant.name)
            fresh = Authenticator(store, ttl=0, on_redis_error="fail_open", max_stale=300)
            stale = Authenticator(store, ttl=0, on_redis_error="fail_open", max_stale=0.2)
            for auth in (fresh, stale):
                await auth.authenticate(f"Bearer {api_key}")
            process.stop(timeout=10)
            await asyncio.sleep(0.3)
            assert (await fresh.authenticate(f"Bearer {api_key}")).tenant.name == tenant.name
            with pytest.raises(APIError) as caught:
                await stale.authenticate(f"Bearer {api_key}")
        finally:
            await redis.aclose()
    assert caught.value.status == 503 and caught.value.code == "service_unavailable"
