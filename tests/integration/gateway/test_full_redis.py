"""A Redis full under `noeviction` refuses limited requests; it never admits them unlimited."""

import uuid

import pytest
from redis.exceptions import OutOfMemoryError

from maas_services.common.openai_api.errors import APIError
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.tenants import Tenant
from tests.integration.gateway.private_redis import private_redis


async def fill(url: str) -> None:
    """Write until Redis refuses a write for memory."""
    redis = open_redis(url)
    try:
        with pytest.raises(OutOfMemoryError):
            for batch in range(10_000):
                async with redis.pipeline(transaction=False) as pipe:
                    for i in range(100):
                        pipe.set(f"fill:{batch}:{i}", "x" * 1024)
                    await pipe.execute()
        # Just full, client buffers freed later could bring it back under its
        # limit for a few writes; half the limit keeps it full for the test.
        used = (await redis.info("memory"))["used_memory"]
        await redis.config_set("maxmemory", used // 2)
    finally:
        await redis.aclose()


@pytest.fixture
async def redis_url(tmp_path):
    """This module's gateways see a full Redis (overrides the shared one)."""
    async with private_redis(
        tmp_path, "--maxmemory", "4mb", "--maxmemory-policy", "noeviction"
    ) as (url, _):
        await fill(url)
        yield url


@pytest.mark.parametrize("on_error", ["fail_open", "fail_closed"])
async def test_a_limited_request_is_refused_with_the_cause(make_cluster, on_error):
    cluster = await make_cluster(replicas=1, rate_limit_on_redis_error=on_error)
    limited = Tenant(name=f"full-{uuid.uuid4().hex[:8]}", rpm=100, max_concurrency=4)
    with pytest.raises(APIError) as caught:
        await cluster.open(limited)
    error = caught.value
    assert error.status == 503 and error.code == "service_unavailable"
    assert "the rate-limit store is out of memory" in error.message
    assert error.body()["error"]["type"] == "service_unavailable"
