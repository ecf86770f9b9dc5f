"""A burst of commands larger than the connection pool waits for connections, never fails.

redis-py's default pool raised MaxConnectionsError past 100 connections: under one
tenant's flood the limiter and quota checks failed, and failing open they let every
tenant on the replica through unlimited (services/common/redis_client.py).
"""

import asyncio

from maas_services.common.redis_client import MAX_CONNECTIONS, open_redis
from tests.integration.gateway.private_redis import private_redis


async def test_a_burst_past_the_pool_size_is_served_on_the_pools_connections(tmp_path):
    # A server of its own, without AOF: on the session's shared one (every test's
    # writes appended to disk) a CI run once saw 64 redis TimeoutErrors, one per new
    # connection, on a busy machine; a stalled server is not what this test is about.
    # The messages are kept so a failure says which timeout it was.
    async with private_redis(tmp_path, "--appendonly", "no") as (url, _):
        redis = open_redis(url)
        try:
            burst = 10 * MAX_CONNECTIONS
            replies = await asyncio.gather(
                *(redis.incr("maas:test:pool-burst") for _ in range(burst)), return_exceptions=True
            )
            errors = sorted(
                {f"{type(r).__name__}: {r}" for r in replies if isinstance(r, BaseException)}
            )
            assert errors == []
            assert int(await redis.get("maas:test:pool-burst")) == burst
            # Every client of this server is this pool's (the check's own included).
            assert len(await redis.client_list()) <= MAX_CONNECTIONS
        finally:
            await redis.aclose()
