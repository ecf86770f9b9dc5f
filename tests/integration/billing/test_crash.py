"""Billing through real crashes: kill -9 of the consumer, kill -9 of Redis."""

import asyncio
import random
import signal
import time
import uuid

import pytest

from maas_services.billing.ledger import Ledger
from maas_services.common.prices import PriceTable
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process

pytestmark = pytest.mark.slow
EVENTS = 1000


def billing(tmp_path, redis_url: str, name: str) -> ManagedProcess:
    port = free_port()
    process = ManagedProcess(
        f"billing-{name}",
        serve_argv(
            "billing",
            {
                "port": port,
                "metrics-port": free_port(),
                "redis-url": redis_url,
                "consumer-name": name,
                "batch-size": 5,
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


async def test_kill9_consumer_and_redis_lose_and_double_count_nothing(tmp_path):
    port = free_port()
    redis_url = f"redis://127.0.0.1:{port}/0"
    server = redis_process(tmp_path, port)
    server.start()
    await wait_ready(server, redis_url, 30)
    redis = open_redis(redis_url)
    ledger = Ledger(redis, USAGE_STREAM, "billing", PriceTable())
    tenant = f"crash-{uuid.uuid4().hex[:6]}"
    rng = random.Random(1)
    events = [
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
    try:
        first = billing(tmp_path, redis_url, "pod-a")
        for e in events:
            await redis.xadd(USAGE_STREAM, e.to_fields())
        # Kill -9 mid-stream: it holds a delivered, unacked batch.
        await wait_for(lambda: _at_least(ledger, tenant, 100))
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
        killed_at = await requests_counted(ledger, tenant)
        assert killed_at < EVENTS, "the consumer finished before it was killed"
        # A replacement pod has a new name: it must claim what pod-a left pending.
        second = billing(tmp_path, redis_url, "pod-b")
        await wait_for(lambda: _at_least(ledger, tenant, EVENTS))
        second.stop(timeout=10)
        totals, _ = await ledger.totals(tenant)
        assert totals.requests == EVENTS
        assert totals.prompt_tokens == sum(e.prompt_tokens for e in events)
        assert totals.completion_tokens == sum(e.completion_tokens for e in events)
        assert (await redis.xpending(USAGE_STREAM, "billing"))["pending"] == 0

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
        server.stop(timeout=10)


async def _at_least(ledger: Ledger, tenant: str, count: int) -> bool:
    return await requests_counted(ledger, tenant) >= count
