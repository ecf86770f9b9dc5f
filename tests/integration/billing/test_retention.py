"""Redis stays flat under traffic: the stream is trimmed, line items live in the database.

Each test gets a redis-server of its own: the trimmer honours every consumer
group of the stream, so groups other tests leave on the shared one would hold
the trim back.
"""

import asyncio
import time
import uuid

import pytest
from prometheus_client import REGISTRY

from maas_services.billing.consumer import UsageConsumer
from maas_services.billing.ledger import DAY, HOUR, PREFIX, Ledger, Retention, bucket_start
from maas_services.billing.retention import StreamTrimmer
from maas_services.billing.store.partitions import day_of
from maas_services.common.prices import PriceTable
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from maas_tools.local.ports import free_port
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process


@pytest.fixture
async def redis(tmp_path):
    port = free_port()
    process = redis_process(tmp_path, port)
    process.start()
    url = f"redis://127.0.0.1:{port}/0"
    await wait_ready(process, url, timeout=30)
    client = open_redis(url)
    yield client
    await client.aclose()
    process.stop(timeout=10)


def event(tenant: str, started_at: float | None = None) -> UsageEvent:
    return UsageEvent(
        request_id=f"chatcmpl-{uuid.uuid4().hex}",
        tenant=tenant,
        model="smollm2-135m-instruct",
        prompt_tokens=120,
        completion_tokens=40,
        started_at=time.time() if started_at is None else started_at,
        duration_seconds=0.5,
    )


async def publish(redis, events: list[UsageEvent]) -> None:
    async with redis.pipeline(transaction=False) as pipe:
        for e in events:
            pipe.xadd(USAGE_STREAM, e.to_fields())
        await pipe.execute()


async def caught_up(redis, group: str) -> bool:
    info = {g["name"]: g for g in await redis.xinfo_groups(USAGE_STREAM)}[group]
    last = (await redis.xinfo_stream(USAGE_STREAM))["last-generated-id"]
    return info["pending"] == 0 and info["last-delivered-id"] == last


async def test_soak_keeps_the_stream_flat_and_redis_under_30_bytes_a_request(redis, store):
    rounds, per_round, tenants = 8, 5_000, 20
    consumer = UsageConsumer(redis, "billing", "soak", batch=500, block_ms=50, store=store)
    trimmer = StreamTrimmer(redis, USAGE_STREAM, interval_seconds=5)
    await consumer.ensure_group()
    consuming = asyncio.create_task(consumer.run())
    before = (await redis.info("memory"))["used_memory"]
    stream_bytes = []
    try:
        for r in range(rounds):
            await publish(redis, [event(f"t{i % tenants}") for i in range(per_round)])
            assert await redis.xlen(USAGE_STREAM) >= per_round
            while not await caught_up(redis, "billing"):
                await asyncio.sleep(0.05)
            await trimmer.trim_once()
            assert await redis.xlen(USAGE_STREAM) == 0, f"round {r}"
            stream_bytes.append(await redis.memory_usage(USAGE_STREAM))
    finally:
        consuming.cancel()
    after = (await redis.info("memory"))["used_memory"]
    # Flat: after billing catches up, the stream holds nothing and weighs the same.
    assert len(set(stream_bytes)) == 1, stream_bytes
    billed = 0
    for i in range(tenants):
        billed += (await consumer.ledger.totals(f"t{i}"))[0].requests
    assert billed == rounds * per_round
    # Line items and dedup are in the database: Redis keeps per tenant running
    # totals and month counters, and a mark per batch for an hour, nothing per request.
    per_request = (after - before) / billed
    print(f"soak: {billed} events, stream {stream_bytes[-1]} B, {per_request:.1f} B/request kept")
    assert per_request < 30
    assert len(await store.items("t0", 0, time.time() + 1)) == billed // tenants


async def test_pending_and_unread_entries_are_never_trimmed(redis):
    await redis.xgroup_create(USAGE_STREAM, "billing", id="0", mkstream=True)
    ids = [await redis.xadd(USAGE_STREAM, event("t").to_fields()) for _ in range(10)]
    delivered = await redis.xreadgroup("billing", "c0", {USAGE_STREAM: ">"}, count=8)
    assert [i for i, _ in delivered[0][1]] == ids[:8]
    # Entries 4 and 5 stay pending (a consumer died mid-batch); 8 and 9 are unread.
    await redis.xack(USAGE_STREAM, "billing", *ids[:4], *ids[6:8])
    trimmer = StreamTrimmer(redis, USAGE_STREAM, interval_seconds=5)
    assert await trimmer.trim_once() == 4
    assert [i for i, _ in await redis.xrange(USAGE_STREAM)] == ids[4:]
    claimed = await redis.xautoclaim(USAGE_STREAM, "billing", "c1", 0, "0-0")
    assert [i for i, _ in claimed[1]] == ids[4:6]
    # A second group that has read nothing holds the whole stream.
    await redis.xgroup_create(USAGE_STREAM, "audit", id="0")
    await redis.xack(USAGE_STREAM, "billing", *ids[4:6])
    assert await trimmer.trim_once() == 0
    assert await redis.xlen(USAGE_STREAM) == 6


async def test_redis_keeps_no_line_items_and_retention_drops_whole_days(redis, store):
    keep = Retention(line_items=3 * DAY, hourly=3 * DAY, daily=40 * DAY, dedup_window=3 * DAY)
    ledger = Ledger(redis, USAGE_STREAM, "billing", PriceTable(), retention=keep, store=store)
    await redis.xgroup_create(USAGE_STREAM, "billing", id="0", mkstream=True)
    now = time.time()
    old, fresh = event("t", started_at=now - 2 * DAY), event("t", started_at=now)
    assert await ledger.commit([("1-0", old), ("2-0", fresh)]) == ["applied", "applied"]
    finished = fresh.started_at + fresh.duration_seconds
    day = bucket_start(finished, DAY)
    month = f"{PREFIX}tenant:t:month:{time.strftime('%Y%m', time.gmtime(finished))}"
    # Redis holds the running totals, the month counter and one batch mark; no
    # bucket, line item or dedup key.
    keys = set(await redis.keys(f"{PREFIX}*"))
    assert {k for k in keys if not k.startswith(f"{PREFIX}batch:")} == {
        f"{PREFIX}tenant:t",
        month,
    }
    ttl = await redis.ttl(month)
    assert day + DAY + keep.daily - time.time() - 2 <= ttl <= day + DAY + keep.daily - now + 1
    assert await redis.ttl(f"{PREFIX}tenant:t") == -1  # the bill itself never expires
    # Retention a day later than the old item's day drops its whole day.
    await store.expire(line_items_before=now - DAY, hours_before=now - DAY, days_before=0)
    items = await ledger.line_items("t", 0, now + 1, offset=0, limit=10)
    assert [i["request_id"] for i in items] == [fresh.request_id]
    if store.dialect == "postgresql":
        async with store.engine.connect() as conn:
            assert day_of(old.started_at) not in await store.partitions.existing(conn)
    # The buckets outlive the line items: they are the rollups, kept on their own.
    days = await ledger.buckets("t", int(now - 3 * DAY), int(now + 1), DAY)
    assert sum(t.requests for _, t in days) == 2


async def test_an_event_outside_the_window_is_acked_and_never_billed(redis, store):
    keep = Retention(dedup_window=DAY)
    ledger = Ledger(redis, USAGE_STREAM, "billing", PriceTable(), retention=keep, store=store)
    await redis.xgroup_create(USAGE_STREAM, "billing", id="0", mkstream=True)
    late = event("t", started_at=time.time() - DAY - HOUR)
    future = event("t", started_at=time.time() + 2 * DAY)
    entries = [await redis.xadd(USAGE_STREAM, e.to_fields()) for e in (late, future)]
    await redis.xreadgroup("billing", "c0", {USAGE_STREAM: ">"})
    outcomes = await ledger.commit(list(zip(entries, (late, future), strict=True)))
    assert outcomes == ["refused", "refused"]
    assert (await redis.xpending(USAGE_STREAM, "billing"))["pending"] == 0
    assert await redis.hgetall(f"{PREFIX}tenant:t") == {}
    assert await store.items("t", 0, time.time() + 3 * DAY) == []
    # Within the window the same request bills once, however often it is replayed.
    recent = event("t", started_at=time.time() - DAY + HOUR)
    assert await ledger.commit([("1-0", recent)]) == ["applied"]
    assert await ledger.commit([("2-0", recent), ("3-0", recent)]) == ["duplicate", "duplicate"]
    assert (await redis.hgetall(f"{PREFIX}tenant:t"))["requests"] == "1"


async def test_a_cancel_always_stops_the_trimmer(redis):
    """Shutdown cancels the trimmer; with no pause between trims every cancel
    lands in or near a Redis command, where redis-py may swallow it."""
    await redis.xadd(USAGE_STREAM, event("t").to_fields())
    await redis.xgroup_create(USAGE_STREAM, "billing", id="0")
    for delay in [i / 200 for i in range(20)]:
        task = asyncio.create_task(StreamTrimmer(redis, USAGE_STREAM, 0).run())
        await asyncio.sleep(delay)
        task.cancel()
        # A hang guard, not a timing claim: a swallowed cancel runs for ever.
        done, _ = await asyncio.wait([task], timeout=30)
        assert done and task.cancelled()


async def test_the_lag_is_the_age_of_the_oldest_entry_not_committed(redis):
    await redis.xgroup_create(USAGE_STREAM, "billing", id="0", mkstream=True)
    trimmer = StreamTrimmer(redis, USAGE_STREAM, interval_seconds=5)
    await trimmer.trim_once()
    assert REGISTRY.get_sample_value("maas_billing_lag_seconds") == 0
    # Entries from two seconds ago, one pending (read, not acked), one unread.
    two_ago = int((time.time() - 2) * 1000)
    ids = [
        await redis.xadd(USAGE_STREAM, event("t").to_fields(), id=f"{two_ago}-{i}")
        for i in range(2)
    ]
    await redis.xreadgroup("billing", "c0", {USAGE_STREAM: ">"}, count=1)
    await trimmer.trim_once()
    assert REGISTRY.get_sample_value("maas_billing_lag_seconds") >= 2
    await redis.xack(USAGE_STREAM, "billing", ids[0])
    await redis.xreadgroup("billing", "c0", {USAGE_STREAM: ">"}, count=1)
    await redis.xack(USAGE_STREAM, "billing", ids[1])
    await trimmer.trim_once()
    assert REGISTRY.get_sample_value("maas_billing_lag_seconds") == 0
