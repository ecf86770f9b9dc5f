"""Moves an older release's Redis ledger into the database, once, at start.

Releases before the database kept every line item in Redis (a sorted set per
tenant, `tenant:<t>:items`), the hour and day buckets as hashes
(`tenant:<t>:hour|day:<start>`) and dedup marks (`seen:<hour>`). Each billing
replica, before it consumes anything, copies the items into `line_items` and
the buckets into the rollups (both insert-or-nothing: running it again, or two
replicas at once, changes nothing), and deletes each key once its contents
are committed. The running totals, month counters and balances stay where
they are: the new ledger keeps them in Redis too. Dedup marks are dropped:
the database's unique key is the dedup now, and every event they guarded was
acked by the release that wrote them.

Items older than the line-item retention are not copied (the old ledger
would have pruned them). An old item carries no duration, so its finish time
is taken as its start; the buckets, which were by finish time, are copied as
they were, so `GetUsage` answers the same before and after.

Cut-over: stop the old billing replicas before the new ones start (a
Deployment with `strategy: Recreate`, or scale to zero first); an old replica
still running would write line items the new ones never migrate.

It needs SCAN and DEL, which the billing ACL user of a Redis with ACLs may not
have (services/common/redis_acl.py): then it is refused, logged
(`redis_ledger_migration_refused`) and skipped, and billing consumes anyway;
the old keys stay, unread, until a billing whose user may run it starts.
"""

import json
import time

from redis.asyncio import Redis
from redis.exceptions import NoPermissionError

from maas_services.billing.ledger import DAY, HOUR, Ledger, Totals
from maas_services.billing.store.line_items import LineItem
from maas_services.common.billing_keys import PREFIX
from maas_services.common.logging import get_logger

log = get_logger(__name__)

CHUNK = 5000
_TENANT = f"{PREFIX}tenant:"


async def migrate_redis_ledger(redis: Redis, ledger: Ledger) -> int:
    """Copy every old-layout key into the database and delete it; line items moved
    (0 when this Redis user may not look for them)."""
    try:
        return await _migrate(redis, ledger)
    except NoPermissionError as exc:
        log.error("redis_ledger_migration_refused", error=str(exc))
        return 0


async def _migrate(redis: Redis, ledger: Ledger) -> int:
    moved = keys = 0
    oldest = time.time() - ledger.retention.line_items
    async for key in redis.scan_iter(match=f"{_TENANT}*", count=1000):
        if key.endswith(":items"):
            moved += await _move_items(
                redis, ledger, key, key[len(_TENANT) : -len(":items")], oldest
            )
        else:
            head, kind, start = key.rsplit(":", 2)
            if kind not in ("hour", "day") or not start.isdigit() or not head.startswith(_TENANT):
                continue  # a running-totals or month key: it stays
            raw = await redis.hgetall(key)
            if raw:
                await ledger.store.import_bucket(
                    head[len(_TENANT) :],
                    int(start),
                    HOUR if kind == "hour" else DAY,
                    Totals.from_hash(raw),
                )
        await redis.delete(key)
        keys += 1
    async for key in redis.scan_iter(match=f"{PREFIX}seen:*", count=1000):
        await redis.delete(key)
        keys += 1
    if keys:
        log.info("redis_ledger_migrated", keys=keys, line_items=moved)
    return moved


async def _move_items(redis: Redis, ledger: Ledger, key: str, tenant: str, oldest: float) -> int:
    moved, offset = 0, 0
    while True:
        members = await redis.zrangebyscore(key, oldest, "+inf", start=offset, num=CHUNK)
        if not members:
            return moved
        items = []
        for member in members:
            old = json.loads(member)
            items.append(
                LineItem(
                    request_id=old["request_id"],
                    tenant=tenant,
                    key_id=old.get("key_id", ""),
                    model=old["model"],
                    deployment=old.get("deployment") or old["model"],
                    started_at=float(old["time"]),
                    finished_at=float(old["time"]),
                    prompt_tokens=int(old["prompt_tokens"]),
                    cached_prompt_tokens=int(old.get("cached_prompt_tokens", 0)),
                    completion_tokens=int(old["completion_tokens"]),
                    cost_nano_usd=int(old["cost_nano_usd"]),
                )
            )
        await ledger.store.import_items(items)
        moved += len(items)
        offset += len(members)
