"""Prepaid balances and monthly budgets move in the same commit as the ledger."""

import time
import uuid

from maas_services.billing.ledger import Ledger
from maas_services.common.prices import ModelPrice, PriceTable
from maas_services.common.quota import Quotas
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent

PRICES = PriceTable(models={"m": ModelPrice(input="1", output="2")})  # $ per million


def usage(tenant: str, prompt: int, completion: int) -> UsageEvent:
    return UsageEvent(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        model="m",
        prompt_tokens=prompt,
        completion_tokens=completion,
        started_at=time.time(),
    )


async def test_balance_runs_out_and_budget_is_enforced(redis_url, store):
    redis = open_redis(redis_url)
    try:
        tenant = f"q-{uuid.uuid4().hex[:6]}"
        quotas = Quotas(redis)
        ledger = Ledger(redis, USAGE_STREAM, "quota-test", PRICES, store=store)
        assert (await quotas.state(tenant)).exhausted is None  # pay as you go
        await quotas.top_up(tenant, 10_000_000)  # $0.01
        entry = await redis.xadd(USAGE_STREAM, {"x": "1"})
        # 3000 in at 1000 nano + 2000 out at 2000 nano = 7,000,000 nano-USD.
        await ledger.commit([(entry, usage(tenant, 3000, 2000))])
        state = await quotas.state(tenant)
        assert state.balance_nano_usd == 3_000_000 and state.exhausted is None
        await ledger.commit([(entry, usage(tenant, 3000, 2000))])
        state = await quotas.state(tenant)
        assert state.balance_nano_usd == -4_000_000
        assert "balance" in state.exhausted
        other = f"q-{uuid.uuid4().hex[:6]}"
        await quotas.set_monthly_budget(other, 100)
        await ledger.commit([(entry, usage(other, 60, 30))])
        assert (await quotas.state(other)).exhausted is None
        await ledger.commit([(entry, usage(other, 5, 5))])
        assert "monthly budget of 100" in (await quotas.state(other)).exhausted
        await quotas.set_monthly_budget(other, None)
        assert (await quotas.state(other)).exhausted is None
    finally:
        await redis.aclose()
