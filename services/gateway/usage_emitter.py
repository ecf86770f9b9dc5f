"""Publishes one usage event per finished request to the Redis stream.

When Redis is unreachable the event goes to a durable local spool instead
(usage_spool.py) and a replay task sends the spool, in order, once Redis is
back. While the spool holds anything, new events queue behind it, so billing
sees events in the order requests finished.

Token counters are counted here, once per finished request: per model always,
per tenant only when `tenant_labels` is given (--metrics-tenant-labels), with
the tenant label bounded as services/common/tenant_labels.py describes.
"""

import asyncio

from prometheus_client import Counter, Gauge
from redis.asyncio import Redis
from redis.exceptions import RedisError

from services.common.logging import get_logger
from services.common.tenant_labels import TenantLabels
from services.common.usage_event import USAGE_STREAM, UsageEvent
from services.gateway.usage_spool import UsageSpool

log = get_logger(__name__)

EMITTED = Counter("maas_gateway_usage_events", "Usage events by outcome", ["outcome"])
SPOOLED = Gauge("maas_gateway_usage_spool_events", "Usage events waiting in the local spool")
TOKENS = Counter("maas_gateway_tokens", "Tokens served, by model and kind", ["model", "kind"])
TENANT_TOKENS = Counter(
    "maas_gateway_tenant_tokens", "Tokens served, by tenant and kind", ["tenant", "kind"]
)
REPLAY_BATCH = 500


class UsageEmitter:
    def __init__(
        self,
        redis: Redis,
        spool: UsageSpool,
        replay_seconds: float = 1.0,
        tenant_labels: TenantLabels | None = None,
    ):
        self._redis = redis
        self._spool = spool
        self._replay_seconds = replay_seconds
        self._tenants = tenant_labels
        self._task: asyncio.Task | None = None
        SPOOLED.set(len(spool))

    async def emit(self, event: UsageEvent) -> None:
        TOKENS.labels(event.model, "prompt").inc(event.prompt_tokens)
        TOKENS.labels(event.model, "completion").inc(event.completion_tokens)
        if self._tenants is not None:
            tenant = self._tenants.label(event.tenant)
            TENANT_TOKENS.labels(tenant, "prompt").inc(event.prompt_tokens)
            TENANT_TOKENS.labels(tenant, "completion").inc(event.completion_tokens)
        async with self._spool.lock:
            if not self._spool.has_events():
                try:
                    await self._redis.xadd(USAGE_STREAM, event.to_fields())
                    EMITTED.labels("published").inc()
                    return
                except RedisError as exc:
                    log.warning("usage_spooled", error=str(exc), request_id=event.request_id)
            await self._spool.append(event)
            EMITTED.labels("spooled").inc()
            SPOOLED.inc()

    def start(self) -> None:
        self._task = asyncio.create_task(self._replay_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.replay()  # a last try; what is left stays spooled for next start

    async def replay(self) -> int:
        """Send spooled events in order; returns how many were sent."""
        async with self._spool.lock:
            events = self._spool.read()[:REPLAY_BATCH]
            sent = 0
            try:
                for event in events:
                    await self._redis.xadd(USAGE_STREAM, event.to_fields())
                    sent += 1
            except RedisError:
                pass
            if sent:
                self._spool.drop_first(sent)
                EMITTED.labels("replayed").inc(sent)
                SPOOLED.set(len(self._spool))
                log.info("usage_spool_replayed", events=sent, left=len(self._spool))
            return sent

    async def _replay_forever(self) -> None:
        while True:
            await asyncio.sleep(self._replay_seconds)
            if self._spool.has_events():
                await self.replay()
