"""The billing consumer against a real Redis and each database: exact, idempotent, crash-safe."""

import asyncio
import time
import uuid

import pytest

from maas_services.billing.consumer import UsageConsumer
from maas_services.billing.running_totals import RunningTotals, effects
from maas_services.billing.store.line_items import LineItemStore
from maas_services.common.prices import ModelPrice, PriceTable
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent


def event(
    tenant: str, prompt: int, completion: int, when: float | None = None, cached: int = 0
) -> UsageEvent:
    return UsageEvent(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        model="m",
        prompt_tokens=prompt,
        cached_prompt_tokens=cached,
        completion_tokens=completion,
        started_at=time.time() if when is None else when,
    )


@pytest.fixture
async def redis(redis_url):
    client = open_redis(redis_url)
    yield client
    await client.aclose()


PRICES = PriceTable(models={"m": ModelPrice(input="0.15", cached_input="0.075", output="0.6")})


def consumer(
    redis, store: LineItemStore, group: str, name: str = "c0", claim_idle_ms: int = 30_000
) -> UsageConsumer:
    return UsageConsumer(
        redis,
        group,
        name,
        batch=50,
        block_ms=100,
        prices=PRICES,
        claim_idle_ms=claim_idle_ms,
        store=store,
    )


async def run_briefly(redis, c: UsageConsumer, group: str, seconds: float = 0.5) -> None:
    """Run the consumer until its group has committed the whole stream (or 60 s),
    and `seconds` more: anything more it did would be a double count."""
    task = asyncio.create_task(c.run())

    async def caught_up() -> bool:
        groups = {g["name"]: g for g in await redis.xinfo_groups(USAGE_STREAM)}
        last = (await redis.xinfo_stream(USAGE_STREAM))["last-generated-id"]
        mine = groups.get(group)
        return bool(mine) and mine["pending"] == 0 and mine["last-delivered-id"] == last

    async with asyncio.timeout(60):
        while not await caught_up():
            await asyncio.sleep(0.05)
    await asyncio.sleep(seconds)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_counts_exactly_and_ignores_duplicate_deliveries(redis, store):
    tenant, group = f"t-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    events = [event(tenant, 10 + i, i) for i in range(50)]
    for e in events:
        await redis.xadd(USAGE_STREAM, e.to_fields())
    # The same request published twice (a gateway retry) counts once.
    await redis.xadd(USAGE_STREAM, events[0].to_fields())
    c = consumer(redis, store, group)
    await run_briefly(redis, c, group)
    totals, models = await c.ledger.totals(tenant)
    assert totals.requests == 50
    assert totals.prompt_tokens == sum(e.prompt_tokens for e in events)
    assert totals.completion_tokens == sum(e.completion_tokens for e in events)
    assert models["m"] == totals
    pending = await redis.xpending(USAGE_STREAM, group)
    assert pending["pending"] == 0


async def test_entries_delivered_before_a_crash_are_applied_on_restart(redis, store):
    tenant, group = f"t-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    c = consumer(redis, store, group)
    await c.ensure_group()
    events = [event(tenant, 3, 4) for _ in range(5)]
    for e in events:
        await redis.xadd(USAGE_STREAM, e.to_fields())
    # A consumer that read the entries and died before processing them.
    delivered = await redis.xreadgroup(group, "c0", {USAGE_STREAM: ">"}, count=100)
    assert len(delivered[0][1]) >= 5
    assert (await redis.xpending(USAGE_STREAM, group))["pending"] >= 5
    # The restarted consumer (same name) re-reads its pending entries first.
    await run_briefly(redis, consumer(redis, store, group), group)
    totals, _ = await c.ledger.totals(tenant)
    assert totals.requests == 5
    assert totals.completion_tokens == 20


async def test_malformed_entry_is_rejected_without_blocking_others(redis, store):
    tenant, group = f"t-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    await redis.xadd(USAGE_STREAM, {"request_id": "x", "tenant": tenant, "prompt_tokens": "-5"})
    good = event(tenant, 1, 2)
    await redis.xadd(USAGE_STREAM, good.to_fields())
    c = consumer(redis, store, group)
    await run_briefly(redis, c, group)
    assert (await c.ledger.totals(tenant))[0].completion_tokens == 2
    assert (await redis.xpending(USAGE_STREAM, group))["pending"] == 0


async def test_buckets_line_items_and_exact_cost(redis, store):
    tenant, group = f"t-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    # Two days ago: inside the dedup window and every retention (ledger.py).
    day = int(time.time()) // 86400 * 86400 - 2 * 86400
    events = [
        event(tenant, 1000, 100, when=day + 10),  # hour 0
        event(tenant, 2000, 50, when=day + 3600 + 5, cached=1500),  # hour 1
        event(tenant, 10, 1, when=day + 86400 + 1),  # next day
    ]
    for e in events:
        await redis.xadd(USAGE_STREAM, e.to_fields())
    c = consumer(redis, store, group)
    await run_briefly(redis, c, group)
    hours = await c.ledger.buckets(tenant, day, day + 2 * 86400, 3600)
    assert [(s - day, t.requests) for s, t in hours] == [(0, 1), (3600, 1), (86400, 1)]
    days = await c.ledger.buckets(tenant, day, day + 2 * 86400, 86400)
    assert [(s - day, t.prompt_tokens) for s, t in days] == [(0, 3000), (86400, 10)]
    totals, _ = await c.ledger.totals(tenant)
    # 0.15 $/M input, 0.075 $/M cached, 0.6 $/M output, in nano-USD (x1000 per token).
    expected = (1000 * 150 + 100 * 600) + (500 * 150 + 1500 * 75 + 50 * 600) + (10 * 150 + 600)
    assert totals.cost_nano_usd == expected
    items = await c.ledger.line_items(tenant, day, day + 86400, offset=0, limit=10)
    assert [i["request_id"] for i in items] == [events[0].request_id, events[1].request_id]
    assert sum(i["cost_nano_usd"] for i in items) + 10 * 150 + 600 == expected


async def test_entries_left_by_a_dead_consumer_are_claimed(redis, store):
    tenant, group = f"t-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    live = consumer(redis, store, group, name="alive", claim_idle_ms=200)
    await live.ensure_group()
    events = [event(tenant, 5, 5) for _ in range(7)]
    for e in events:
        await redis.xadd(USAGE_STREAM, e.to_fields())
    # "dead" read everything and vanished without acking.
    await redis.xreadgroup(group, "dead", {USAGE_STREAM: ">"}, count=10_000)
    await asyncio.sleep(0.3)
    await run_briefly(redis, live, group)
    assert (await live.ledger.totals(tenant))[0].requests == 7
    assert (await redis.xpending(USAGE_STREAM, group))["pending"] == 0


async def test_two_consumers_share_the_group_and_count_each_event_once(redis, store):
    tenant, group = f"t-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    first, second = consumer(redis, store, group, "a"), consumer(redis, store, group, "b")
    await redis.xgroup_create(USAGE_STREAM, group, id="$", mkstream=True)
    events = [event(tenant, 1 + i % 7, 2) for i in range(600)]
    tasks = [asyncio.create_task(c.run()) for c in (first, second)]
    try:
        for e in events:
            await redis.xadd(USAGE_STREAM, e.to_fields())
        # And every tenth one again, as a gateway retry would.
        for e in events[::10]:
            await redis.xadd(USAGE_STREAM, e.to_fields())
        async with asyncio.timeout(60):
            while (await first.ledger.totals(tenant))[0].requests < len(events) or (
                await redis.xpending(USAGE_STREAM, group)
            )["pending"]:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # anything more would be a double count
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    totals, _ = await first.ledger.totals(tenant)
    assert totals.requests == len(events)
    assert totals.prompt_tokens == sum(e.prompt_tokens for e in events)
    assert len(await store.items(tenant, 0, time.time() + 1)) == len(events)
    # Both took a share: the group spread the stream over them.
    consumers = {c["name"] for c in await redis.xinfo_consumers(USAGE_STREAM, group)}
    assert consumers == {"a", "b"}


async def test_a_redelivery_after_xautoclaim_is_billed_once(redis, store):
    tenant, group = f"t-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    slow = consumer(redis, store, group, "slow")
    # A group that starts at the stream's end: only this test's entry.
    await redis.xgroup_create(USAGE_STREAM, group, id="$", mkstream=True)
    e = event(tenant, 11, 5)
    await redis.xadd(USAGE_STREAM, e.to_fields())
    # "slow" read it and committed it, but its ack was lost (it died right after
    # the commit); "fast" claims the entry as abandoned and commits it again.
    delivered = await redis.xreadgroup(group, "slow", {USAGE_STREAM: ">"}, count=10_000)
    assert [f["request_id"] for _, f in delivered[0][1]] == [e.request_id]
    await slow.ledger.store.commit(
        f"crashed-{uuid.uuid4().hex}",
        "slow",
        [slow.ledger.line_item(e)],
        lambda new: effects(new, slow.ledger.retention.daily),
    )
    await asyncio.sleep(0.3)
    fast = consumer(redis, store, group, "fast", claim_idle_ms=200)
    claiming = asyncio.create_task(fast.run())
    try:
        async with asyncio.timeout(30):
            while (await redis.xpending(USAGE_STREAM, group))["pending"]:
                await asyncio.sleep(0.05)
    finally:
        claiming.cancel()
        await asyncio.gather(claiming, return_exceptions=True)
    assert (await fast.ledger.totals(tenant))[0].requests == 1
    assert (await redis.xpending(USAGE_STREAM, group))["pending"] == 0
    assert len(await store.items(tenant, 0, time.time() + 1)) == 1


async def test_a_batch_committed_before_a_crash_reaches_redis_once(redis, store):
    """The crash window between the database commit and Redis: the outbox row
    carries the batch to Redis on restart, and Redis takes it only once."""
    tenant, group = f"t-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    c = consumer(redis, store, group)
    await redis.xgroup_create(USAGE_STREAM, group, id="$", mkstream=True)
    events = [event(tenant, 10, 1) for _ in range(5)]
    for e in events:
        await redis.xadd(USAGE_STREAM, e.to_fields())
    delivered = await redis.xreadgroup(group, "c0", {USAGE_STREAM: ">"}, count=10_000)
    assert delivered
    ledger = c.ledger
    # The first three committed and died before Redis: their outbox row waits.
    first, _ = await ledger.store.commit(
        f"b1-{tenant}",
        "c0",
        [ledger.line_item(e) for e in events[:3]],
        lambda new: effects(new, ledger.retention.daily),
    )
    assert len(first) == 3 and await store.unapplied() == 1
    # The next two committed, reached Redis, and died before deleting their row.
    _, change = await ledger.store.commit(
        f"b2-{tenant}",
        "c0",
        [ledger.line_item(e) for e in events[3:]],
        lambda new: effects(new, ledger.retention.daily),
    )
    assert await RunningTotals(redis, USAGE_STREAM, group).apply(f"b2-{tenant}", change, [])
    assert (await ledger.totals(tenant))[0].requests == 2
    # The restarted consumer applies batch-1, skips batch-2 (Redis has it),
    # and its redelivered entries insert nothing.
    restarted = asyncio.create_task(consumer(redis, store, group).run())
    try:
        async with asyncio.timeout(30):
            while (await redis.xpending(USAGE_STREAM, group))["pending"]:
                await asyncio.sleep(0.05)
    finally:
        restarted.cancel()
        await asyncio.gather(restarted, return_exceptions=True)
    totals, _ = await ledger.totals(tenant)
    assert totals.requests == 5 and totals.prompt_tokens == 50
    assert (await redis.xpending(USAGE_STREAM, group))["pending"] == 0
