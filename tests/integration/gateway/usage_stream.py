"""A tenant's usage events as the gateway wrote them to the session's Redis stream."""

from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent


async def usage_events(redis_url: str, tenant: str) -> list[UsageEvent]:
    redis = open_redis(redis_url)
    try:
        entries = await redis.xrange(USAGE_STREAM)
    finally:
        await redis.aclose()
    # Only the tenant's own: the session's stream also holds other tests' entries,
    # malformed ones included (the billing consumer's poison tests).
    return [UsageEvent.from_fields(f) for _, f in entries if f.get("tenant") == tenant]
