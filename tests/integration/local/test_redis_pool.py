"""A burst of commands larger than the connection pool waits for connections, never fails.

redis-py's default pool raised MaxConnectionsError past 100 connections: under one
tenant's flood the limiter and quota checks failed, and failing open they let every
tenant on the replica through unlimited (services/common/redis_client.py).
"""

import asyncio

from maas_services.common.redis_client import MAX_CONNECTIONS, open_redis


async def test_a_burst_past_the_pool_size_is_served_on_the_pools_connections(redis_url):
    redis = open_redis(redis_url)
    try:
        # The server is the session's: other tests' clients may be connected too.
        others = len(await redis.client_list()) - 1
        burst = 10 * MAX_CONNECTIONS
        replies = await asyncio.gather(
            *(redis.incr("maas:test:pool-burst") for _ in range(burst)), return_exceptions=True
        )
        assert [r for r in replies if isinstance(r, BaseException)] == []
        assert int(await redis.get("maas:test:pool-burst")) == burst
        assert len(await redis.client_list()) - others <= MAX_CONNECTIONS
    finally:
        await redis.aclose()
