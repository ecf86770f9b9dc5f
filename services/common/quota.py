"""Quotas: a prepaid balance or a monthly token budget per tenant.

Both live beside the ledger so the Lua commit that charges a request also
moves them (services/billing/ledger.py): the balance in nano-USD is decremented by each
request's cost; the month's token counter grows by its tokens. The gateway
asks `exhausted()` before admitting a request and refuses with OpenAI's
`insufficient_quota` 429; a prepaid request then also reserves its most cost
against the balance (balance_reservations.py), so requests in flight cannot
spend it twice. A request in flight when the quota runs out finishes and is
billed: quotas stop new work, they never cut a stream.
"""

import time
from dataclasses import dataclass

from redis.asyncio import Redis

from maas_services.common.billing_keys import PREFIX, balance_key, month_key

SETTINGS_PREFIX = f"{PREFIX}quota:"


@dataclass
class QuotaState:
    balance_nano_usd: int | None  # None: no prepaid balance, pay as you go
    monthly_token_budget: int | None  # None: no budget
    tokens_this_month: int

    @property
    def exhausted(self) -> str | None:
        """Why new requests are refused, or None."""
        if self.balance_nano_usd is not None and self.balance_nano_usd <= 0:
            return "the prepaid balance is used up"
        if (
            self.monthly_token_budget is not None
            and self.tokens_this_month >= self.monthly_token_budget
        ):
            return f"the monthly budget of {self.monthly_token_budget} tokens is used up"
        return None


class Quotas:
    def __init__(self, redis: Redis):
        self._redis = redis

    async def state(self, tenant: str, now: float | None = None) -> QuotaState:
        now = time.time() if now is None else now
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(balance_key(tenant))
            pipe.hget(SETTINGS_PREFIX + tenant, "monthly_token_budget")
            pipe.hget(month_key(tenant, now), "tokens")
            balance, budget, used = await pipe.execute()
        return QuotaState(
            balance_nano_usd=None if balance is None else int(balance),
            monthly_token_budget=None if budget is None else int(budget),
            tokens_this_month=int(used or 0),
        )

    async def set_monthly_budget(self, tenant: str, tokens: int | None) -> None:
        if tokens is None:
            await self._redis.hdel(SETTINGS_PREFIX + tenant, "monthly_token_budget")
        else:
            await self._redis.hset(SETTINGS_PREFIX + tenant, "monthly_token_budget", tokens)

    async def top_up(self, tenant: str, nano_usd: int) -> int:
        """Add to the prepaid balance (creating it: the tenant becomes prepaid)."""
        return await self._redis.incrby(balance_key(tenant), nano_usd)
