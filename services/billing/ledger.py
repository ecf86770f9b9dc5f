"""The per-tenant ledger in Redis, written exactly once per request.

One Lua script applies an event: the dedup mark, running totals, the hour and
day buckets, the line item, the monthly token counter and the prepaid balance;
it drops the gateway's reservation on that balance and XACKs the stream entry.
A crash at any point either applied all of it or nothing, and a redelivered or
duplicated event is acked without counting twice.

Keys (all under maas:billing:):
  seen:<hour start>               request ids that started in that hour (dedup)
  tenant:<t>                      running totals, also per model (the name the client sent)
  tenant:<t>:hour:<unix start>    hourly bucket
  tenant:<t>:day:<unix start>     daily bucket
  tenant:<t>:items                line items, a sorted set scored by time
  tenant:<t>:month:<YYYYMM>       tokens used this month (quotas)
  balance:<t>                     prepaid balance in nano-USD, if the tenant has one
  reserved:{<t>}:*                the gateway's holds on the balance, the request's
                                  dropped as it is charged (common/balance_reservations.py)

Retention. Everything but the running totals and balances expires with the
age of the data, reckoned from the request's start (see Retention): buckets by
EXPIREAT, line items by pruning the sorted set on every write and by a TTL on
the whole set (a tenant that stops sending lets it expire). The dedup marks
are one set per hour of start time rather than a key per request (about half
the bytes, docs/billing.md), kept dedup_window past their hour. An event that
started longer ago than the window is acked and not billed: its mark may be
gone, and billing it could bill it twice, which a ledger must never do. The
window therefore has to outlast the oldest event that can still arrive (the
stream's backlog and the gateway's spool), which the trimmer keeps short.
"""

import json
import time
from dataclasses import dataclass

from prometheus_client import Counter
from redis.asyncio import Redis

from maas_services.common.balance_reservations import RELEASE_FUNCTION, reservation_keys
from maas_services.common.billing_keys import PREFIX, balance_key, month_key, tenant_key
from maas_services.common.logging import get_logger
from maas_services.common.prices import PriceTable
from maas_services.common.usage_event import UsageEvent

log = get_logger(__name__)

PAST_WINDOW = Counter(
    "maas_billing_events_past_dedup_window",
    "Usage events acked unbilled because they started before the dedup window",
)
UNPRICED = Counter(
    "maas_billing_unpriced_events",
    "Usage events billed at the default price: the price table lists no price "
    "for the deployment that served them",
    ["deployment"],
)

HOUR, DAY = 3600, 86400
FIELDS = ("requests", "prompt_tokens", "cached_prompt_tokens", "completion_tokens", "cost_nano_usd")

_APPLY = (
    RELEASE_FUNCTION
    + """
local fresh = ARGV[16] == '1' and redis.call('SADD', KEYS[1], ARGV[15]) == 1
if fresh then
  redis.call('EXPIREAT', KEYS[1], ARGV[1])
  local model = ARGV[4]
  local values = {requests = 1, prompt_tokens = ARGV[5], cached_prompt_tokens = ARGV[6],
                  completion_tokens = ARGV[7], cost_nano_usd = ARGV[8]}
  for i = 2, 4 do
    for field, value in pairs(values) do
      redis.call('HINCRBY', KEYS[i], field, value)
      redis.call('HINCRBY', KEYS[i], 'model:' .. model .. ':' .. field, value)
    end
  end
  redis.call('EXPIREAT', KEYS[3], ARGV[11])
  redis.call('EXPIREAT', KEYS[4], ARGV[12])
  redis.call('ZADD', KEYS[5], ARGV[9], ARGV[10])
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', '(' .. ARGV[13])
  redis.call('EXPIRE', KEYS[5], ARGV[14])
  redis.call('HINCRBY', KEYS[7], 'tokens', ARGV[5] + ARGV[7])
  redis.call('EXPIREAT', KEYS[7], ARGV[12])
  if redis.call('EXISTS', KEYS[8]) == 1 then
    redis.call('DECRBY', KEYS[8], ARGV[8])
  end
end
-- Charged (or charged before): the gateway's hold on the balance has done its work.
release_reservation(KEYS[9], KEYS[10], KEYS[11], ARGV[15])
redis.call('XACK', KEYS[6], ARGV[2], ARGV[3])
if fresh then return 1 end
return 0
"""
)


@dataclass(frozen=True)
class Retention:
    """How long the ledger keeps each kind of key, in seconds of data age."""

    line_items: int = 90 * DAY
    hourly: int = 30 * DAY
    daily: int = 400 * DAY
    dedup_window: int = 7 * DAY


def bucket_start(when: float, size: int) -> int:
    return int(when // size) * size


@dataclass
class Totals:
    requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_nano_usd: int = 0

    @classmethod
    def from_hash(cls, raw: dict[str, str], prefix: str = "") -> "Totals":
        return cls(**{f: int(raw.get(prefix + f, 0)) for f in FIELDS})

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Ledger:
    def __init__(
        self,
        redis: Redis,
        stream: str,
        group: str,
        prices: PriceTable,
        retention: Retention | None = None,
    ):
        self._redis = redis
        self._stream = stream
        self._group = group
        self._prices = prices
        self._retention = retention or Retention()
        self._apply = redis.register_script(_APPLY)

    async def apply(self, entry_id: str, event: UsageEvent) -> bool:
        """Commit the event and ack its entry; False when it was already counted
        or started before the dedup window."""
        now = time.time()
        keep = self._retention
        in_window = event.started_at > now - keep.dedup_window
        finished = event.started_at + event.duration_seconds
        hour, day = bucket_start(finished, HOUR), bucket_start(finished, DAY)
        seen_hour = bucket_start(event.started_at, HOUR)
        deployment = event.served_by
        cost = self._prices.for_deployment(deployment).cost_nano_usd(
            event.prompt_tokens, event.cached_prompt_tokens, event.completion_tokens
        )
        item = {
            "request_id": event.request_id,
            "model": event.model,
            "deployment": deployment,
            "key_id": event.key_id,
            "time": event.started_at,
            "prompt_tokens": event.prompt_tokens,
            "cached_prompt_tokens": event.cached_prompt_tokens,
            "completion_tokens": event.completion_tokens,
            "cost_nano_usd": cost,
        }
        t = event.tenant
        applied = await self._apply(
            keys=[
                f"{PREFIX}seen:{seen_hour}",
                tenant_key(t),
                tenant_key(t, f":hour:{hour}"),
                tenant_key(t, f":day:{day}"),
                tenant_key(t, ":items"),
                self._stream,
                month_key(t, finished),
                balance_key(t),
                *reservation_keys(t),
            ],
            args=[
                seen_hour + HOUR + keep.dedup_window,
                self._group,
                entry_id,
                event.model,
                event.prompt_tokens,
                event.cached_prompt_tokens,
                event.completion_tokens,
                cost,
                event.started_at,
                json.dumps(item, sort_keys=True),
                hour + HOUR + keep.hourly,
                day + DAY + keep.daily,
                now - keep.line_items,
                keep.line_items,
                event.request_id,
                int(in_window),
            ],
        )
        if not in_window:
            PAST_WINDOW.inc()
            log.error(
                "usage_event_past_dedup_window",
                entry_id=entry_id,
                request_id=event.request_id,
                started_at=event.started_at,
            )
        if applied and not self._prices.lists(deployment):
            UNPRICED.labels(deployment).inc()
        return bool(applied)

    async def totals(self, tenant: str) -> tuple[Totals, dict[str, Totals]]:
        raw = await self._redis.hgetall(tenant_key(tenant))
        models = sorted(
            {k[len("model:") :].rsplit(":", 1)[0] for k in raw if k.startswith("model:")}
        )
        return Totals.from_hash(raw), {m: Totals.from_hash(raw, f"model:{m}:") for m in models}

    async def buckets(
        self, tenant: str, start: int, end: int, size: int
    ) -> list[tuple[int, Totals]]:
        starts = list(range(bucket_start(start, size), end, size))
        suffix = "hour" if size == HOUR else "day"
        async with self._redis.pipeline(transaction=False) as pipe:
            for s in starts:
                pipe.hgetall(tenant_key(tenant, f":{suffix}:{s}"))
            raws = await pipe.execute()
        return [(s, Totals.from_hash(raw)) for s, raw in zip(starts, raws, strict=True) if raw]

    async def line_items(
        self, tenant: str, start: float, end: float, offset: int, limit: int
    ) -> list[dict]:
        members = await self._redis.zrangebyscore(
            tenant_key(tenant, ":items"), start, f"({end}", start=offset, num=limit
        )
        return [json.loads(m) for m in members]
