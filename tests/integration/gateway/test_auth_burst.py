"""A burst of requests with one key costs Redis one key lookup, not one each."""

import asyncio
import uuid

from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.tenants import TenantStore


async def key_reads(redis) -> int:
    return int((await redis.info("commandstats")).get("cmdstat_hgetall", {}).get("calls", 0))


async def test_concurrent_misses_share_one_lookup(redis_url):
    redis = open_redis(redis_url)
    store = TenantStore(redis)
    tenant = await store.create_tenant(f"burst-{uuid.uuid4().hex[:8]}")
    _, api_key = await store.create_key(tenant.name)
    auth = Authenticator(store, ttl=60)
    before = await key_reads(redis)
    principals = await asyncio.gather(*(auth.authenticate(f"Bearer {api_key}") for _ in range(16)))
    assert {p.tenant.name for p in principals} == {tenant.name}
    # The key's record and its tenant's: one lookup.
    assert await key_reads(redis) - before == 2
    await redis.aclose()
