"""The quota state is read once per TTL per replica, not once per request."""

import uuid

import pytest

from maas_services.common.openai_api.errors import APIError
from maas_services.common.quota import Quotas
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.quota_gate import QuotaGate


async def reads(redis) -> int:
    stats = await redis.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("get", "hget"))


async def test_a_burst_reads_the_quota_once_and_a_used_up_budget_still_refuses(redis_url):
    redis = open_redis(redis_url)
    tenant = f"quota-{uuid.uuid4().hex[:8]}"
    try:
        cached, uncached = QuotaGate(redis, ttl=60), QuotaGate(redis, ttl=0)
        before = await reads(redis)
        for _ in range(5):
            await cached.check(tenant)
        # One state read: the balance and the budget with its month's tokens.
        assert await reads(redis) - before == 3
        await Quotas(redis).set_monthly_budget(tenant, 0)
        with pytest.raises(APIError) as caught:
            await uncached.check(tenant)
        assert caught.value.code == "insufficient_quota"
    finally:
        await redis.aclose()
