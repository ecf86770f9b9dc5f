"""A Redis that answers with an error is not down: limits, quotas and keys refuse, saying why."""

import uuid

import pytest

from maas_services.common.billing_keys import balance_key
from maas_services.common.openai_api.errors import APIError
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.quota_gate import QuotaGate
from maas_services.gateway.admission.rate_limiter import RateLimiter
from maas_services.gateway.admission.tenants import Tenant, TenantStore, hash_key
from maas_tools.local.ports import free_port
from tests.integration.gateway.private_redis import private_redis


def name() -> str:
    return f"err-{uuid.uuid4().hex[:8]}"


def assert_refused(error: APIError, cause: str) -> None:
    assert error.status == 503 and error.code == "service_unavailable"
    assert cause in error.message


@pytest.fixture
async def shared(redis_url):
    redis = open_redis(redis_url)
    yield redis
    await redis.aclose()


async def test_a_read_only_replica_refuses_limited_requests(tmp_path):
    # A replica of a primary that is not there: up, answering, read-only.
    replica = ("--replicaof", "127.0.0.1", str(free_port()))
    async with private_redis(tmp_path, *replica) as (url, _):
        redis = open_redis(url)
        try:
            limiter = RateLimiter(redis, lease_seconds=60, on_redis_error="fail_open")
            with pytest.raises(APIError) as caught:
                await limiter.admit(Tenant(name=name(), rpm=10), "a", 1)
        finally:
            await redis.aclose()
    assert_refused(caught.value, "the rate-limit store is read-only")


async def test_a_quota_the_store_cannot_read_refuses_the_request(shared):
    tenant = name()
    await shared.rpush(balance_key(tenant), "not a balance")
    with pytest.raises(APIError) as caught:
        await QuotaGate(shared, on_redis_error="fail_open").check(tenant)
    assert_refused(caught.value, "the quota store refused the request")


async def test_a_key_the_store_cannot_read_is_not_served_from_the_cache(shared):
    store = TenantStore(shared)
    tenant = await store.create_tenant(name())
    _, api_key = await store.create_key(tenant.name)
    auth = Authenticator(store, ttl=0, on_redis_error="fail_open")
    await auth.authenticate(f"Bearer {api_key}")
    record = f"maas:apikey:{hash_key(api_key)}"
    await shared.delete(record)
    await shared.rpush(record, "not a key record")
    with pytest.raises(APIError) as caught:
        await auth.authenticate(f"Bearer {api_key}")
    assert_refused(caught.value, "the key store refused the request")
