"""One way to open Redis, so timeouts and decoding match everywhere."""

import redis.asyncio as aioredis

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def open_redis(url: str) -> aioredis.Redis:
    # Short socket timeouts: a dead Redis must surface as an error in a
    # request's lifetime, not hang it.
    return aioredis.Redis.from_url(
        url, decode_responses=True, socket_connect_timeout=2.0, socket_timeout=5.0
    )
