"""Billing end to end through the gateway: usage API isolation, quotas, and the
spool that keeps every billed token while Redis is down."""

import asyncio
import signal
import time

import httpx
import pytest

from maas_services.billing.ledger import Ledger
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_services.common.prices import PriceTable
from maas_services.common.quota import Quotas
from maas_services.common.redis_client import open_redis
from maas_services.common.service_token import ENV as SERVICE_TOKEN_ENV
from maas_services.common.usage_event import USAGE_STREAM
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process
from tests.e2e.tenants import new_tenant_key

pytestmark = pytest.mark.slow


async def complete(client: httpx.AsyncClient, base: str, key: str, max_tokens: int = 4):
    return await client.post(
        f"{base}/v1/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": DEFAULT_MODEL_ID, "prompt": "Hello", "max_tokens": max_tokens},
    )


async def wait_until(predicate, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def test_usage_api_shows_only_the_callers_usage(stack):
    (a, key_a), (b, key_b) = [await new_tenant_key(stack.redis_url) for _ in range(2)]
    async with httpx.AsyncClient(timeout=60) as client:
        replies = [await complete(client, stack.gateway_url, key_a) for _ in range(2)]
        billed = sum(r.json()["usage"]["total_tokens"] for r in replies)

        async def a_billed() -> bool:
            r = await client.get(
                f"{stack.gateway_url}/v1/usage?granularity=hour",
                headers={"Authorization": f"Bearer {key_a}"},
            )
            return r.json()["totals"]["total_tokens"] == billed

        await wait_until(a_billed)
        usage_a = (
            await client.get(
                f"{stack.gateway_url}/v1/usage",
                params={"granularity": "hour"},
                headers={"Authorization": f"Bearer {key_a}"},
            )
        ).json()
        usage_b = (
            await client.get(
                f"{stack.gateway_url}/v1/usage",
                params={"tenant": a},  # ignored: the key decides
                headers={"Authorization": f"Bearer {key_b}"},
            )
        ).json()
        anonymous = await client.get(f"{stack.gateway_url}/v1/usage")
        bad = await client.get(
            f"{stack.gateway_url}/v1/usage",
            params={"granularity": "week"},
            headers={"Authorization": f"Bearer {key_a}"},
        )
    assert usage_a["tenant"] == a and sum(b["total_tokens"] for b in usage_a["data"]) == billed
    assert usage_b["tenant"] == b and usage_b["totals"]["total_tokens"] == 0
    assert anonymous.status_code == 401
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "granularity"


async def test_exhausted_monthly_budget_is_refused_with_insufficient_quota(stack):
    tenant, key = await new_tenant_key(stack.redis_url)
    redis = open_redis(stack.redis_url)
    try:
        await Quotas(redis).set_monthly_budget(tenant, 1)
        async with httpx.AsyncClient(timeout=60) as client:
            first = await complete(client, stack.gateway_url, key)
            assert first.status_code == 200  # in budget when it started

            async def refused() -> bool:
                r = await complete(client, stack.gateway_url, key)
                return r.status_code == 429

            await wait_until(refused)
            last = await complete(client, stack.gateway_url, key)
        assert last.json()["error"]["code"] == "insufficient_quota"
        assert last.json()["error"]["type"] == "insufficient_quota"
    finally:
        await redis.aclose()


async def test_redis_outage_is_spooled_and_replayed_exactly(stack, tmp_path):
    port = free_port()
    redis_url = f"redis://127.0.0.1:{port}/0"
    server = redis_process(tmp_path, port)
    server.start()
    await wait_ready(server, redis_url, 30)
    tenant, key = await new_tenant_key(redis_url)
    http_port = free_port()
    base = f"http://127.0.0.1:{http_port}"
    gateway = ManagedProcess(
        "gateway-spool",
        serve_argv(
            "gateway",
            {
                "port": http_port,
                "grpc-port": free_port(),
                "metrics-port": free_port(),
                "redis-url": redis_url,
                "tokenizer-address": stack.addresses["tokenizer"],
                "router-address": stack.addresses["router"],
                "usage-spool-dir": tmp_path / "spool",
                # Keys this replica has already checked keep working while Redis is down.
                "auth-on-redis-error": "fail_open",
            },
        ),
        tmp_path / "gateway.log",
        # Its calls to the stack's tokenizer and router carry the stack's token.
        env={SERVICE_TOKEN_ENV: stack.service_token},
    )
    gateway.start()
    billing = None
    try:
        await wait_ready(gateway, f"{base}/readyz", 120)
        async with httpx.AsyncClient(timeout=60) as client:
            served = [await complete(client, base, key)]
            server.process.send_signal(signal.SIGKILL)
            server.process.wait()
            for _ in range(4):
                served.append(await complete(client, base, key, max_tokens=3))
            assert all(r.status_code == 200 for r in served), [r.text for r in served]
            # Each event is written once its response has gone out: wait for the last.
            spool = tmp_path / "spool" / "usage.jsonl"
            deadline = time.monotonic() + 10
            while spool.read_text().count("\n") < 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert spool.read_text().count("\n") >= 4
            server = redis_process(tmp_path, port)
            server.start()
            await wait_ready(server, redis_url, 30)
        billing = ManagedProcess(
            "billing-spool",
            serve_argv(
                "billing",
                {
                    "port": free_port(),
                    "metrics-port": free_port(),
                    "redis-url": redis_url,
                    "billing-database-url": f"sqlite:///{tmp_path / 'billing.db'}",
                    "consumer-name": "spool-test",
                },
            ),
            tmp_path / "billing.log",
        )
        billing.start()
        redis = open_redis(redis_url)
        ledger = Ledger(redis, USAGE_STREAM, "billing", PriceTable())
        expected = sum(r.json()["usage"]["total_tokens"] for r in served)

        async def all_billed() -> bool:
            totals, _ = await ledger.totals(tenant)
            return totals.requests == len(served)

        await wait_until(all_billed)
        totals, _ = await ledger.totals(tenant)
        await redis.aclose()
        assert totals.total_tokens == expected
        assert (tmp_path / "spool" / "usage.jsonl").read_text() == ""
    finally:
        gateway.stop(10)
        if billing is not None:
            billing.stop(10)
        server.stop(10)
