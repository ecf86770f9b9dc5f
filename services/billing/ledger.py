"""The ledger: each usage event billed exactly once, in the database and in Redis.

A batch of stream entries commits in three steps (docs/billing.md, "Storage"):
  1. one database transaction inserts the batch's line items (unique on
     request id and day: a duplicate inserts nothing), the rollups of the new
     ones and an outbox row with what they add to Redis (store/line_items.py);
  2. one Lua script applies that outbox row to Redis's running totals, month
     counters, balances and reservations, unless its batch is marked applied,
     and XACKs every entry of the batch (running_totals.py);
  3. the outbox row is deleted.
A crash after 1 leaves the entries pending (redelivered, inserting nothing)
and the outbox row (applied by `recover`); a crash after 2 leaves a row whose
batch Redis has marked. Nothing is acked before it is committed.

Which events are billed at all: one that started before the dedup window (its
line item, the dedup key, may have been dropped by retention, so billing it
could bill it twice) or more than a day in the future is refused: acked,
logged and counted, never billed.

Redis, all under maas:billing:
  tenant:<t>                      running totals, also per model (the name the client sent)
                                  and per LoRA adapter
  tenant:<t>:month:<YYYYMM>       tokens used this month (quotas)
  balance:<t>                     prepaid balance in nano-USD, if the tenant has one
  reserved:{<t>}:*                the gateway's holds on the balance (balance_reservations.py)
  batch:<id>                      a batch applied, for an hour (running_totals.py)
"""

import uuid
from dataclasses import dataclass

from prometheus_client import Counter
from redis.asyncio import Redis

from maas_services.billing.running_totals import RunningTotals, effects
from maas_services.billing.store.line_items import HOUR, LineItem, LineItemStore, Totals
from maas_services.billing.store.partitions import DAY, Window
from maas_services.common.billing_keys import PREFIX, tenant_key
from maas_services.common.logging import get_logger
from maas_services.common.prices import ModelPrice, PriceTable
from maas_services.common.usage_event import UsageEvent

__all__ = ["DAY", "HOUR", "PREFIX", "Ledger", "Retention", "Totals", "bucket_start"]

log = get_logger(__name__)

REFUSED = Counter(
    "maas_billing_events_refused",
    "Usage events acked unbilled: they started before the dedup window or more than "
    "a day in the future",
    ["reason"],
)
UNPRICED = Counter(
    "maas_billing_unpriced_events",
    "Usage events billed at the default price: the price table lists no price "
    "for the deployment that served them",
    ["deployment"],
)


@dataclass(frozen=True)
class Retention:
    """How long billing keeps each kind of record, in seconds of data age."""

    line_items: int = 90 * DAY
    hourly: int = 30 * DAY
    daily: int = 400 * DAY
    # Events that started longer ago are refused (at most the line items' keep:
    # the line item is the dedup key).
    dedup_window: int = 7 * DAY

    @property
    def billable(self) -> Window:
        return Window(min(self.dedup_window, self.line_items))


def grouped(raw: dict[str, str], group: str) -> dict[str, Totals]:
    """The running totals under `<group>:<name>:` of a tenant's hash, by name."""
    head = f"{group}:"
    names = sorted({k[len(head) :].rsplit(":", 1)[0] for k in raw if k.startswith(head)})
    return {name: Totals.from_hash(raw, f"{head}{name}:") for name in names}


def bucket_start(when: float, size: int) -> int:
    return int(when // size) * size


class Ledger:
    def __init__(
        self,
        redis: Redis,
        stream: str,
        group: str,
        prices: PriceTable,
        retention: Retention | None = None,
        store: LineItemStore | None = None,
        consumer: str = "billing",
    ):
        self._redis = redis
        self._prices = prices
        self.retention = retention or Retention()
        self.store = store or LineItemStore()
        self._consumer = consumer
        self._totals = RunningTotals(redis, stream, group)

    def price(self, event: UsageEvent) -> ModelPrice:
        """The deployment's price, or its adapter's (prices.py); a batch line's
        is its batch price."""
        price = self._prices.for_served(event.served_by, event.adapter)
        return price.for_batch() if event.batch_id else price

    def line_item(self, event: UsageEvent) -> LineItem:
        deployment = event.served_by
        return LineItem(
            request_id=event.request_id,
            tenant=event.tenant,
            key_id=event.key_id,
            model=event.model,
            deployment=deployment,
            started_at=event.started_at,
            finished_at=event.started_at + event.duration_seconds,
            prompt_tokens=event.prompt_tokens,
            cached_prompt_tokens=event.cached_prompt_tokens,
            completion_tokens=event.completion_tokens,
            cost_nano_usd=self.price(event).cost_nano_usd(
                event.prompt_tokens, event.cached_prompt_tokens, event.completion_tokens
            ),
            finish_reason=event.finish_reason,
            adapter=event.adapter,
        )

    async def commit(
        self, entries: list[tuple[str, UsageEvent]], also_ack: list[str] = ()
    ) -> list[str]:
        """Bill a batch of stream entries exactly once and ack them (with
        `also_ack`, entries that bill nothing); each entry's outcome: applied,
        duplicate (billed before, or earlier in this batch) or refused."""
        window = self.retention.billable
        items: dict[tuple[str, int], LineItem] = {}
        keys: list[tuple[str, int] | None] = []
        for entry_id, event in entries:
            refusal = window.refusal(event.started_at)
            if refusal:
                REFUSED.labels(refusal).inc()
                log.error(
                    "usage_event_refused",
                    reason=refusal,
                    entry_id=entry_id,
                    request_id=event.request_id,
                    tenant=event.tenant,
                    started_at=event.started_at,
                )
                keys.append(None)
                continue
            item = self.line_item(event)
            key = (item.request_id, item.day)
            items.setdefault(key, item)
            keys.append(key)
        batch_id = uuid.uuid4().hex
        daily = self.retention.daily
        inserted, change = await self.store.commit(
            batch_id, self._consumer, list(items.values()), lambda new: effects(new, daily)
        )
        # Counted at the commit that bills them, before anything else can fail.
        for item in inserted:
            if not self._prices.lists(item.deployment):
                UNPRICED.labels(item.deployment).inc()
        acks = [entry_id for entry_id, _ in entries] + list(also_ack)
        await self._totals.apply(batch_id, change, acks)
        if inserted:
            await self.store.forget(batch_id)
        new = {(item.request_id, item.day) for item in inserted}
        outcomes = []
        for key in keys:
            outcomes.append("refused" if key is None else "applied" if key in new else "duplicate")
            new.discard(key)
        return outcomes

    async def recover(self, older_than: float = 0.0) -> int:
        """Apply the outbox rows older than `older_than` seconds: batches committed
        by a replica that died before Redis had them; how many."""

        async def apply(batch_id: str, change: str) -> None:
            if await self._totals.apply(batch_id, change, []):
                log.warning("billing_batch_recovered", batch_id=batch_id)

        return await self.store.claim_unapplied(older_than, apply)

    async def totals(self, tenant: str) -> tuple[Totals, dict[str, Totals]]:
        """The tenant's running totals, and per model (the name the client sent)."""
        raw = await self._redis.hgetall(tenant_key(tenant))
        return Totals.from_hash(raw), grouped(raw, "model")

    async def adapter_totals(self, tenant: str) -> dict[str, Totals]:
        """The tenant's running totals per LoRA adapter (requests run with one)."""
        return grouped(await self._redis.hgetall(tenant_key(tenant)), "adapter")

    async def buckets(
        self, tenant: str, start: int, end: int, size: int
    ) -> list[tuple[int, Totals]]:
        return await self.store.buckets(tenant, start, end, size)

    async def line_items(
        self, tenant: str, start: float, end: float, offset: int, limit: int
    ) -> list[dict]:
        """ListLineItems' page: the proto's fields, oldest first."""
        rows = await self.store.items(tenant, start, end, offset, limit)
        return [
            {
                "request_id": r["request_id"],
                "model": r["model"],
                "deployment": r["deployment"],
                "key_id": r["key_id"],
                "time": r["started_at"],
                "prompt_tokens": r["prompt_tokens"],
                "cached_prompt_tokens": r["cached_prompt_tokens"],
                "completion_tokens": r["completion_tokens"],
                "cost_nano_usd": r["cost_nano_usd"],
                "adapter": r["adapter"],
            }
            for r in rows
        ]
