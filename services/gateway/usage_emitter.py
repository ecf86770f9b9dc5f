"""Publishes one usage event per finished request to the Redis stream.

Durable spooling while Redis is down is the billing issue's work; until then a
failed XADD is logged with the full event and counted, so nothing is silent.
"""

from prometheus_client import Counter
from redis.asyncio import Redis
from redis.exceptions import RedisError

from services.common.logging import get_logger
from services.common.usage_event import USAGE_STREAM, UsageEvent

log = get_logger(__name__)

EMITTED = Counter("maas_gateway_usage_events", "Usage events published", ["outcome"])
TOKENS = Counter("maas_gateway_tokens", "Tokens served, by model and kind", ["model", "kind"])


class UsageEmitter:
    def __init__(self, redis: Redis):
        self._redis = redis

    async def emit(self, event: UsageEvent) -> None:
        TOKENS.labels(event.model, "prompt").inc(event.prompt_tokens)
        TOKENS.labels(event.model, "completion").inc(event.completion_tokens)
        try:
            await self._redis.xadd(USAGE_STREAM, event.to_fields())
        except RedisError as exc:
            EMITTED.labels("failed").inc()
            log.error("usage_event_lost", error=str(exc), event=event.model_dump())
            return
        EMITTED.labels("published").inc()
