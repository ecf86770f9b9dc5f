"""What a committed batch adds to Redis, applied once and acknowledged in one script.

Redis keeps, per tenant, only what the gateway must read fast: the running
totals (also per model: the name the client sent, and per LoRA adapter), the
month's token counter (quotas), the prepaid balance and its reservations. A batch's line items are
in the database first (store/line_items.py); `effects` turns the rows that
were new into a list of increments, stored in the batch's outbox row, and
APPLY runs them in Redis with the XACK of the batch's stream entries.

Exactly once on the Redis side: APPLY first checks the batch's mark
(`maas:billing:batch:<id>`, one key per batch, not per request, expiring after
`mark_ttl`); a batch already applied is not applied again, however often a
crash makes a replica retry it from the outbox. The mark must outlive the
outbox row, which the consumer deletes right after APPLY and the upkeep loop
retries within a minute; an hour covers any database outage the consumer
survives (while the database is down nothing new commits, and the first thing
a recovered consumer does is retry the outbox).
"""

import json
from collections import defaultdict

from redis.asyncio import Redis

from maas_services.billing.store.line_items import LineItem
from maas_services.common.balance_reservations import RELEASE_FUNCTION, reservation_keys
from maas_services.common.billing_keys import PREFIX, balance_key, month_key, tenant_key

DAY = 86400
MARK_TTL = 3600


def mark_key(batch_id: str) -> str:
    return f"{PREFIX}batch:{batch_id}"


# KEYS: the batch's mark, the stream, then the keys the effects name (from 3).
# ARGV: the effects' JSON ('' to only ack), the mark's TTL, the group, entry ids.
# Effects: {"keys": [...], "ops": [op...]}, op one of
#   {"hincrby": k, "fields": {f: "n"}, "expireat": "t" (optional)}
#   {"decrby_existing": k, "by": "n"}               the prepaid balance, if any
#   {"release": [deadlines, costs, sum], "ids": [request ids]}
# with k an index into "keys" (0-based). Numbers travel as strings (Lua's
# doubles print 14 digits). Returns 1 when it applied the effects, else 0.
APPLY = (
    RELEASE_FUNCTION
    + """
local applied = 0
if ARGV[1] ~= '' and redis.call('EXISTS', KEYS[1]) == 0 then
  local effects = cjson.decode(ARGV[1])
  local function key(k) return KEYS[k + 3] end
  for _, op in ipairs(effects.ops) do
    if op.hincrby then
      for field, value in pairs(op.fields) do
        redis.call('HINCRBY', key(op.hincrby), field, value)
      end
      if op.expireat then redis.call('EXPIREAT', key(op.hincrby), op.expireat) end
    elseif op.decrby_existing then
      if redis.call('EXISTS', key(op.decrby_existing)) == 1 then
        redis.call('DECRBY', key(op.decrby_existing), op.by)
      end
    elseif op.release then
      local r = op.release
      for _, id in ipairs(op.ids) do
        release_reservation(key(r[1]), key(r[2]), key(r[3]), id)
      end
    end
  end
  redis.call('SET', KEYS[1], '1', 'EX', ARGV[2])
  applied = 1
end
if #ARGV > 3 then
  redis.call('XACK', KEYS[2], ARGV[3], unpack(ARGV, 4))
end
return applied
"""
)


def effects(inserted: list[LineItem], daily_retention: int) -> str:
    """The outbox JSON of what `inserted` adds to Redis (APPLY's effects)."""
    keys: list[str] = []
    index: dict[str, int] = {}

    def k(name: str) -> int:
        if name not in index:
            index[name] = len(keys)
            keys.append(name)
        return index[name]

    totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    months: dict[tuple[str, str], int] = defaultdict(int)
    month_expiry: dict[tuple[str, str], int] = {}
    costs: dict[str, int] = defaultdict(int)
    ids: dict[str, list[str]] = defaultdict(list)
    for item in inserted:
        fields = totals[item.tenant]
        values = (
            ("requests", 1),
            ("prompt_tokens", item.prompt_tokens),
            ("cached_prompt_tokens", item.cached_prompt_tokens),
            ("completion_tokens", item.completion_tokens),
            ("cost_nano_usd", item.cost_nano_usd),
        )
        for name, value in values:
            fields[name] += value
            fields[f"model:{item.model}:{name}"] += value
            if item.adapter:
                fields[f"adapter:{item.adapter}:{name}"] += value
        month = month_key(item.tenant, item.finished_at)
        months[(item.tenant, month)] += item.prompt_tokens + item.completion_tokens
        # Kept as long as the daily buckets, from the end of the day it was last written.
        expiry = int(item.finished_at // DAY) * DAY + DAY + daily_retention
        month_expiry[(item.tenant, month)] = max(month_expiry.get((item.tenant, month), 0), expiry)
        costs[item.tenant] += item.cost_nano_usd
        ids[item.tenant].append(item.request_id)
    ops: list[dict] = []
    for tenant, fields in totals.items():
        ops.append(
            {"hincrby": k(tenant_key(tenant)), "fields": {f: str(v) for f, v in fields.items()}}
        )
        ops.append({"decrby_existing": k(balance_key(tenant)), "by": str(costs[tenant])})
        ops.append({"release": [k(key) for key in reservation_keys(tenant)], "ids": ids[tenant]})
    for (_tenant, month), tokens in months.items():
        ops.append(
            {
                "hincrby": k(month),
                "fields": {"tokens": str(tokens)},
                "expireat": str(month_expiry[(_tenant, month)]),
            }
        )
    return json.dumps({"keys": keys, "ops": ops}, separators=(",", ":"))


class RunningTotals:
    """APPLY against one Redis: a batch's effects and its stream entries' XACK."""

    def __init__(self, redis: Redis, stream: str, group: str, mark_ttl: int = MARK_TTL):
        self._redis = redis
        self._stream = stream
        self._group = group
        self._mark_ttl = mark_ttl
        self._apply = redis.register_script(APPLY)

    async def apply(self, batch_id: str | None, effects_json: str, entry_ids: list[str]) -> bool:
        """Apply a batch's effects (unless applied before) and ack `entry_ids`;
        True when this call applied them."""
        keys = json.loads(effects_json)["keys"] if effects_json else []
        applied = await self._apply(
            keys=[mark_key(batch_id or "none"), self._stream, *keys],
            args=[effects_json, self._mark_ttl, self._group, *entry_ids],
        )
        return bool(applied)
