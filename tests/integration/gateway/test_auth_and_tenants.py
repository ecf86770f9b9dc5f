"""Tenants, keys and authentication against real Redis, as replicas see them."""

import asyncio
import uuid

import pytest

from maas_services.common.openai_api.errors import APIError
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.tenants import TenantExistsError, TenantStore, hash_key
from maas_tools.local.ports import free_port
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process


@pytest.fixture
async def store(redis_url):
    redis = open_redis(redis_url)
    yield TenantStore(redis)
    await redis.aclose()


def name() -> str:
    return f"acme-{uuid.uuid4().hex[:8]}"


async def test_tenant_limits_round_trip_through_redis(store):
    created = await store.create_tenant(
        name(), tier="premium", rpm=60, tpm=1000, max_concurrency=2, allowed_models=("a", "b")
    )
    assert await store.get_tenant(created.name) == created
    updated = await store.update_tenant(created.name, rpm=120, allowed_models="c")
    assert (updated.rpm, updated.tpm, updated.allowed_models) == (120, 1000, ("c",))
    assert created.name in [t.name for t in await store.list_tenants()]
    with pytest.raises(TenantExistsError):
        await store.create_tenant(created.name)
    with pytest.raises(ValueError):
        await store.update_tenant(created.name, rpm=-1)


async def test_keys_are_stored_only_as_hashes(store, redis_url):
    tenant = await store.create_tenant(name())
    key_id, api_key = await store.create_key(tenant.name)
    redis = open_redis(redis_url)
    try:
        values = [
            v
            for k in await redis.keys("maas:*")
            if await redis.type(k) == "hash"
            for v in (await redis.hgetall(k)).values()
        ] + [await redis.get(f"maas:keyid:{key_id}")]
    finally:
        await redis.aclose()
    assert api_key not in values and hash_key(api_key) in values


async def test_revoked_key_and_disabled_tenant_fail_within_the_cache_ttl(store):
    auth = Authenticator(store, ttl=0.3)
    tenant = await store.create_tenant(name())
    key_id, api_key = await store.create_key(tenant.name)
    assert (await auth.authenticate(f"Bearer {api_key}")).key_id == key_id
    await store.revoke_key(key_id)
    await asyncio.sleep(0.35)
    with pytest.raises(APIError) as caught:
        await auth.authenticate(f"Bearer {api_key}")
    assert caught.value.status == 401

    _, other_key = await store.create_key(tenant.name)
    await auth.authenticate(f"Bearer {other_key}")
    await store.disable_tenant(tenant.name)
    await asyncio.sleep(0.35)
    with pytest.raises(APIError):
        await auth.authenticate(f"Bearer {other_key}")


@pytest.mark.parametrize("mode", ["fail_closed", "fail_open"])
async def test_redis_down_fails_closed_or_serves_known_keys(tmp_path, mode):
    # A Redis of its own, to stop under the authenticator's feet.
    port = free_port()
    process = redis_process(tmp_path, port)
    process.start()
    url = f"redis://127.0.0.1:{port}/0"
    await wait_ready(process, url, timeout=30)
    redis = open_redis(url)
    try:
        store = TenantStore(redis)
        tenant = await store.create_tenant(name())
        _, api_key = await store.create_key(tenant.name)
        auth = Authenticator(store, ttl=0, on_redis_error=mode)
        await auth.authenticate(f"Bearer {api_key}")
        process.stop(timeout=10)
        if mode == "fail_open":
            assert (await auth.authenticate(f"Bearer {api_key}")).tenant.name == tenant.name
        else:
            with pytest.raises(APIError) as caught:
                await auth.authenticate(f"Bearer {api_key}")
            assert caught.value.status == 503
        # A key this replica never checked cannot be trusted either way.
        with pytest.raises(APIError) as caught:
            await auth.authenticate("Bearer sk-maas-never-seen")
        assert caught.value.status == 503
    finally:
        process.stop(timeout=10)
        await redis.aclose()
