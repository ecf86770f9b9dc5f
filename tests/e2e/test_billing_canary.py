"""An alias with a canary split, end to end: the gateway routes `smollm2` to two
deployments (two real engines), and billing charges each request what the
deployment that served it costs, with the client's name on the line item."""

import asyncio
import time
from decimal import Decimal

import httpx
import pytest
import yaml

from maas_services.billing.ledger import Ledger
from maas_services.billing.store.line_items import LineItemStore
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_services.common.prices import ModelPrice, PriceTable
from maas_services.common.redis_client import open_redis
from maas_services.common.service_token import ENV as SERVICE_TOKEN_ENV
from maas_services.common.usage_event import USAGE_STREAM
from maas_services.gateway.routing.routing_table import Target, pick
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process
from tests.e2e.tenants import new_tenant_key

pytestmark = pytest.mark.slow

ALIAS, CANARY = "smollm2", f"{DEFAULT_MODEL_ID}-canary"
ROUTES = [Target(deployment=DEFAULT_MODEL_ID, weight=90), Target(deployment=CANARY, weight=10)]
PRICES = PriceTable(
    models={
        DEFAULT_MODEL_ID: ModelPrice(input=Decimal("0.05"), output=Decimal("0.10")),
        CANARY: ModelPrice(input=Decimal("0.5"), output=Decimal("1")),
    }
)


def write_config(tmp_path) -> tuple:
    routes, prices = tmp_path / "routes.yaml", tmp_path / "prices.yaml"
    routes.write_text(
        yaml.safe_dump(
            {
                "models": {ALIAS: {"routes": [t.model_dump() for t in ROUTES]}},
                "deployments": {CANARY: {"tokenizer": DEFAULT_MODEL_ID}},
            }
        )
    )
    prices.write_text(yaml.safe_dump(PRICES.model_dump(mode="json")))
    return routes, prices


async def test_an_alias_and_its_canary_are_billed_at_their_deployments_prices(stack, tmp_path):
    routes, prices = write_config(tmp_path)
    # Billing of its own on a Redis of its own: the stack's billing has no prices.
    redis_port = free_port()
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    canary_port, router_port, billing_port = free_port(), free_port(), free_port()
    database_url = f"sqlite:///{tmp_path / 'billing.db'}"
    http_port = free_port()
    base = f"http://127.0.0.1:{http_port}"

    def service(name: str, flags: dict) -> ManagedProcess:
        argv = serve_argv(name, {"metrics-port": free_port(), **flags})
        # One release with the stack: its tokenizer and engine take this token.
        env = {SERVICE_TOKEN_ENV: stack.service_token}
        return ManagedProcess(f"{name}-canary-test", argv, tmp_path / f"{name}.log", env=env)

    server = redis_process(tmp_path, redis_port)
    canary = service("engine", {"port": canary_port, "engine-id": "canary-0", "model-id": CANARY})
    engines = [f"engine-0={stack.addresses['engine-0']}", f"canary-0=127.0.0.1:{canary_port}"]
    router = service("router", {"port": router_port, "engines": engines})
    billing = service(
        "billing",
        {
            "port": billing_port,
            "redis-url": redis_url,
            "billing-database-url": database_url,
            "prices-file": prices,
        },
    )
    gateway = service(
        "gateway",
        {
            "port": http_port,
            "grpc-port": free_port(),
            "redis-url": redis_url,
            "tokenizer-address": stack.addresses["tokenizer"],
            "router-address": f"127.0.0.1:{router_port}",
            "routes-file": routes,
            "usage-spool-dir": tmp_path / "spool",
        },
    )
    started = []
    try:
        for process, probe in [
            (server, redis_url),
            (canary, f"127.0.0.1:{canary_port}"),
            (router, f"127.0.0.1:{router_port}"),
            (billing, f"127.0.0.1:{billing_port}"),
            (gateway, f"{base}/readyz"),
        ]:
            process.start()
            started.append(process)
            await wait_ready(process, probe, 300)
        tenant, key = await new_tenant_key(redis_url)
        # Sessions are sticky to a deployment: one that lands on each side.
        sessions = {pick(ROUTES, f"{ALIAS}/s{i}"): f"s{i}" for i in range(200)}
        served = {}
        async with httpx.AsyncClient(timeout=120) as client:
            for deployment, session in sessions.items():
                reply = await client.post(
                    f"{base}/v1/completions",
                    headers={"Authorization": f"Bearer {key}", "x-session-id": session},
                    json={"model": ALIAS, "prompt": "Hello", "max_tokens": 3},
                )
                assert reply.status_code == 200, reply.text
                served[deployment] = reply.json()["usage"]

        redis = open_redis(redis_url)
        store = LineItemStore(database_url)
        try:
            ledger = Ledger(redis, USAGE_STREAM, "billing", PRICES, store=store)
            deadline = time.monotonic() + 60
            while (await ledger.totals(tenant))[0].requests < len(served):
                assert time.monotonic() < deadline, "the requests were never billed"
                await asyncio.sleep(0.1)
            items = await ledger.line_items(tenant, 0, float("inf"), offset=0, limit=10)
        finally:
            await redis.aclose()
            await store.close()
    finally:
        for process in reversed(started):
            process.stop(10)

    assert sorted(i["deployment"] for i in items) == sorted([DEFAULT_MODEL_ID, CANARY])
    for item in items:
        usage = served[item["deployment"]]
        assert item["model"] == ALIAS
        assert (item["prompt_tokens"], item["completion_tokens"]) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
        )
        price = PRICES.models[item["deployment"]]
        expected = price.cost_nano_usd(
            item["prompt_tokens"], item["cached_prompt_tokens"], item["completion_tokens"]
        )
        assert item["cost_nano_usd"] == expected > 0
