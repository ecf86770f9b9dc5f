"""Billing through Redis failures: unready while Redis cannot take writes, live
throughout, and exact once Redis is back. A real redis-server and a real
`maas serve billing`, probed over gRPC health as the kubelet does."""

import asyncio
import random
import time
import uuid

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from maas_services.billing.consumer import UsageConsumer
from maas_services.billing.health import LIVENESS_SERVICE
from maas_services.billing.ledger import Ledger
from maas_services.common.prices import PriceTable
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process

pytestmark = pytest.mark.slow
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# Short enough that an outage outlasts it several times over: liveness staying
# SERVING then shows the loop kept beating, not that the window was long.
STUCK_AFTER_SECONDS = 6
OUTAGE_SECONDS = 2 * STUCK_AFTER_SECONDS


class Billing:
    def __init__(self, tmp_path, redis_url: str):
        self.port, self.metrics_port = free_port(), free_port()
        self.process = ManagedProcess(
            "billing",
            serve_argv(
                "billing",
                {
                    "port": self.port,
                    "metrics-port": self.metrics_port,
                    "redis-url": redis_url,
                    "billing-database-url": f"sqlite:///{tmp_path / 'billing.db'}",
                    "consumer-name": "pod-a",
                    "stuck-after-seconds": STUCK_AFTER_SECONDS,
                },
            ),
            tmp_path / "billing.log",
        )
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        self.health = health_pb2_grpc.HealthStub(self.channel)

    async def status(self, service: str = "") -> int:
        request = health_pb2.HealthCheckRequest(service=service)
        return (await self.health.Check(request, timeout=5)).status

    async def wait_status(self, status: int) -> None:
        await wait_for(lambda: self._is(status))

    async def _is(self, status: int) -> bool:
        return await self.status() == status

    async def metric(self, name: str) -> float:
        async with httpx.AsyncClient() as client:
            text = (await client.get(f"http://127.0.0.1:{self.metrics_port}/metrics")).text
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        return sum(s.value for s in samples if s.name == name)

    async def stays_live_but_unready(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert await self.status(LIVENESS_SERVICE) == SERVING, self.process.log_tail()
            assert await self.status() == NOT_SERVING
            assert await self.status("maas.v1.Billing") == NOT_SERVING
            await asyncio.sleep(0.5)


async def wait_for(predicate, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


def events(tenant: str, count: int) -> list[UsageEvent]:
    return [
        UsageEvent(
            request_id=uuid.uuid4().hex,
            tenant=tenant,
            model="m",
            prompt_tokens=1 + i % 97,
            completion_tokens=1 + i % 31,
            started_at=time.time(),
        )
        for i in range(count)
    ]


@pytest.fixture
async def redis_server(tmp_path):
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    server = redis_process(tmp_path, port)
    server.start()
    await wait_ready(server, url, 30)
    holder = {"process": server, "port": port, "url": url}
    yield holder
    holder["process"].stop(timeout=10)


@pytest.fixture
async def billing(tmp_path, redis_server):
    running = Billing(tmp_path, redis_server["url"])
    running.process.start()
    await wait_ready(running.process, f"127.0.0.1:{running.port}", 60)
    yield running
    await running.channel.close()
    running.process.stop(timeout=10)


async def assert_billed_exactly(redis, tenant: str, sent: list[UsageEvent]) -> None:
    ledger = Ledger(redis, USAGE_STREAM, "billing", PriceTable())

    async def all_billed() -> bool:
        return (await ledger.totals(tenant))[0].requests >= len(sent)

    await wait_for(all_billed)
    assert (await redis.xpending(USAGE_STREAM, "billing"))["pending"] == 0
    totals, _ = await ledger.totals(tenant)
    assert totals.requests == len(sent)
    assert totals.prompt_tokens == sum(e.prompt_tokens for e in sent)
    assert totals.completion_tokens == sum(e.completion_tokens for e in sent)


async def test_out_of_memory_makes_billing_unready_then_resumes_exactly(redis_server, billing):
    redis = open_redis(redis_server["url"])
    tenant = f"oom-{uuid.uuid4().hex[:6]}"
    before, during = events(tenant, 100), events(tenant, 100)
    try:
        for e in before:
            await redis.xadd(USAGE_STREAM, e.to_fields())
        await assert_billed_exactly(redis, tenant, before)
        committed_at = await billing.metric("maas_billing_last_commit_timestamp_seconds")
        assert committed_at > 0
        # Atomically: entries billing will read but cannot commit, then OOM.
        async with redis.pipeline(transaction=True) as tx:
            for e in during:
                tx.xadd(USAGE_STREAM, e.to_fields())
            tx.config_set("maxmemory", 1)
            await tx.execute()
        await billing.wait_status(NOT_SERVING)
        await billing.stays_live_but_unready(OUTAGE_SECONDS)
        assert await billing.metric("maas_billing_consumer_failures_total") > 0
        assert await billing.metric("maas_billing_consumer_ready") == 0
        ledger = Ledger(redis, USAGE_STREAM, "billing", PriceTable())
        assert (await ledger.totals(tenant))[0].requests == len(before)

        await redis.config_set("maxmemory", 0)
        await billing.wait_status(SERVING)
        await assert_billed_exactly(redis, tenant, before + during)
        assert await billing.metric("maas_billing_last_commit_timestamp_seconds") > committed_at
        assert await billing.metric("maas_billing_event_lag_seconds") >= 0
    finally:
        await redis.config_set("maxmemory", 0)
        await redis.aclose()


async def test_redis_restart_makes_billing_unready_then_resumes_exactly(
    tmp_path, redis_server, billing
):
    redis = open_redis(redis_server["url"])
    tenant = f"restart-{uuid.uuid4().hex[:6]}"
    sent, after = events(tenant, 1000), events(tenant, 100)
    try:
        async with redis.pipeline(transaction=False) as pipe:
            for e in sent:
                pipe.xadd(USAGE_STREAM, e.to_fields())
            await pipe.execute()

        async def some_billed() -> bool:
            ledger = Ledger(redis, USAGE_STREAM, "billing", PriceTable())
            return (await ledger.totals(tenant))[0].requests > 0

        await wait_for(some_billed)
        # A clean shutdown writes the AOF out, so every XADD survives it and
        # the totals can be compared exactly (test_crash.py covers kill -9).
        redis_server["process"].stop(timeout=10)
        await redis.aclose()
        await billing.wait_status(NOT_SERVING)
        await billing.stays_live_but_unready(OUTAGE_SECONDS)

        redis_server["process"] = redis_process(tmp_path, redis_server["port"])
        redis_server["process"].start()
        await wait_ready(redis_server["process"], redis_server["url"], 30)
        redis = open_redis(redis_server["url"])
        await billing.wait_status(SERVING)
        for e in after:
            await redis.xadd(USAGE_STREAM, e.to_fields())
        await assert_billed_exactly(redis, tenant, sent + after)
    finally:
        await redis.aclose()


async def test_a_cancel_always_stops_the_consumer(redis_server):
    """Shutdown cancels the consumer; redis-py swallows some cancellations that
    land inside a command, so each lands at a different point of a backlog
    (on a Redis of its own: the backlog would slow other tests' fresh groups)."""
    redis = open_redis(redis_server["url"])
    rng = random.Random(7)
    try:
        for e in events(f"cancel-{uuid.uuid4().hex[:6]}", 2000):
            await redis.xadd(USAGE_STREAM, e.to_fields())
        for _ in range(20):
            consumer = UsageConsumer(redis, f"g-{uuid.uuid4().hex[:6]}", "c0", 100, 100)
            task = asyncio.create_task(consumer.run())
            await asyncio.sleep(rng.uniform(0, 0.3))
            task.cancel()
            # A hang guard, not a timing claim: a swallowed cancel runs for ever.
            done, _ = await asyncio.wait([task], timeout=30)
            assert done and task.cancelled()
    finally:
        await redis.aclose()
