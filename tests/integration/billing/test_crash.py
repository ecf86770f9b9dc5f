"""Billing through real crashes: kill -9 of the consumer, of Redis, of PostgreSQL."""

import asyncio
import random
import signal
import time
import uuid

import pytest

from maas_services.billing.ledger import Ledger
from maas_services.billing.store.line_items import LineItemStore
from maas_services.common.prices import PriceTable
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process
from tests.integration.billing.conftest import assert_reconciled
from tests.postgres import running_postgres

pytestmark = pytest.mark.slow
EVENTS = 1000


def billing(tmp_path, redis_url: str, name: str, database_url: str) -> ManagedProcess:
    port = free_port()
    process = ManagedProcess(
        f"billing-{name}",
        serve_argv(
            "billing",
            {
                "port": port,
                "metrics-port": free_port(),
                "redis-url": redis_url,
                "billing-database-url": database_url,
                "consumer-name": name,
                "batch-size": 5,
                "upkeep-interval-seconds": 1,
                "claim-idle-ms": 300,
            },
        ),
        tmp_path / f"billing-{name}.log",
    )
    process.start()
    return process


async def requests_counted(ledger: Ledger, tenant: str) -> int:
    return (await ledger.totals(tenant))[0].requests


async def wait_for(predicate, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def usage_events(tenant: str) -> list[UsageEvent]:
    rng = random.Random(1)
    return [
        UsageEvent(
            request_id=uuid.uuid4().hex,
            tenant=tenant,
            model="m",
            prompt_tokens=rng.randint(1, 500),
            completion_tokens=rng.randint(1, 200),
            started_at=time.time(),
        )
        for _ in range(EVENTS)
    ]


async def test_kill9_consumer_and_redis_lose_and_double_count_nothing(tmp_path, database_url):
    port = free_port()
    redis_url = f"redis://127.0.0.1:{port}/0"
    server = redis_process(tmp_path, port)
    server.start()
    await wait_ready(server, redis_url, 30)
    redis = open_redis(redis_url)
    ledger = Ledger(redis, USAGE_STREAM, "billing", PriceTable())
    tenant = f"crash-{uuid.uuid4().hex[:6]}"
    events = usage_events(tenant)
    store = LineItemStore(database_url)
    try:
        first = billing(tmp_path, redis_url, "pod-a", database_url)
        for e in events:
            await redis.xadd(USAGE_STREAM, e.to_fields())
        # Kill -9 mid-stream: it holds a delivered, unacked batch.
        await wait_for(lambda: _at_least(ledger, tenant, 100))
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
        killed_at = await requests_counted(ledger, tenant)
        assert killed_at < EVENTS, "the consumer finished before it was killed"
        # A replacement pod has a new name: it must claim what pod-a left pending.
        second = billing(tmp_path, redis_url, "pod-b", database_url)
        await wait_for(lambda: _at_least(ledger, tenant, EVENTS))
        second.stop(timeout=10)
        totals, _ = await ledger.totals(tenant)
        assert totals.requests == EVENTS
        assert totals.prompt_tokens == sum(e.prompt_tokens for e in events)
        assert totals.completion_tokens == sum(e.completion_tokens for e in events)
        assert (await redis.xpending(USAGE_STREAM, "billing"))["pending"] == 0
        assert len(await store.items(tenant, 0, time.time() + 1)) == EVENTS
        await assert_reconciled(redis, store)

        # Redis itself dies hard; AOF (fsync every second) brings every count back.
        await asyncio.sleep(1.5)
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
        await redis.aclose()
        server = redis_process(tmp_path, port)
        server.start()
        await wait_ready(server, redis_url, 30)
        redis = open_redis(redis_url)
        ledger = Ledger(redis, USAGE_STREAM, "billing", PriceTable())
        assert (await ledger.totals(tenant))[0] == totals
    finally:
        await redis.aclose()
        await store.close()
        server.stop(timeout=10)


@pytest.fixture
def own_postgres():
    """A PostgreSQL of the test's own: it is killed."""
    yield from running_postgres()


async def test_postgres_killed_mid_stream_acks_nothing_uncommitted_and_bills_once(
    tmp_path, own_postgres
):
    """kill -9 of the database under load: billing stays up, nothing is acked
    that is not committed, and the backlog drains once, when it returns."""
    database_url = own_postgres.url()
    port = free_port()
    redis_url = f"redis://127.0.0.1:{port}/0"
    server = redis_process(tmp_path, port)
    server.start()
    await wait_ready(server, redis_url, 30)
    redis = open_redis(redis_url)
    store = LineItemStore(database_url)
    ledger = Ledger(redis, USAGE_STREAM, "billing", PriceTable())
    tenant = f"pgcrash-{uuid.uuid4().hex[:6]}"
    events = usage_events(tenant)
    process = billing(tmp_path, redis_url, "pod-pg", database_url)
    try:
        for e in events:
            await redis.xadd(USAGE_STREAM, e.to_fields())
        await wait_for(lambda: _at_least(ledger, tenant, 100))
        own_postgres.kill()
        await asyncio.sleep(3)  # billing fails its passes meanwhile
        during = await requests_counted(ledger, tenant)
        assert during < EVENTS, "billing finished before the database was killed"
        await asyncio.sleep(2)
        # Nothing moved while the database was down.
        assert await requests_counted(ledger, tenant) == during
        own_postgres.start()
        await wait_for(lambda: _at_least(ledger, tenant, EVENTS))
        await asyncio.sleep(1)
        totals, _ = await ledger.totals(tenant)
        assert totals.requests == EVENTS
        assert totals.prompt_tokens == sum(e.prompt_tokens for e in events)
        assert len(await store.items(tenant, 0, time.time() + 1)) == EVENTS
        await assert_reconciled(redis, store)
    finally:
        process.stop(timeout=10)
        await redis.aclose()
        await store.close()
        server.stop(timeout=10)


async def _at_least(ledger: Ledger, tenant: str, count: int) -> bool:
    return await requests_counted(ledger, tenant) >= count
