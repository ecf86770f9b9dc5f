"""Refuse tenants whose prepaid balance or monthly token budget is used up.

The quota state is billing's, laid out in services/common/quota.py and
billing_keys.py (billing writes it, the gateway only reads it). Like rate limits, a Redis
outage fails open by default: serving a few requests past a quota is cheaper
than refusing every tenant, and the ledger still bills them. Only an outage:
a Redis that answers with an error refuses the request (see store_faults).

A tenant's state is read at most once per `ttl` seconds per replica (0.5 s,
as keys are): the ledger moves it only as usage events are billed, seconds
after the requests, so a read per request bought no accuracy for its round
trip. What the store could not answer is never kept.
"""

import time

from prometheus_client import Counter
from redis.asyncio import Redis

from services.common.logging import get_logger
from services.common.quota import Quotas, QuotaState
from services.gateway.errors import APIError, unavailable
from services.gateway.store_faults import STORE_FAILURES, refused, unreachable

log = get_logger(__name__)

QUOTA_CHECKS = Counter("maas_gateway_quota_checks", "Quota checks by outcome", ["outcome"])


def insufficient_quota(reason: str) -> APIError:
    return APIError(
        429,
        f"You exceeded your current quota: {reason}. Top up or raise the budget to continue.",
        type="insufficient_quota",
        code="insufficient_quota",
    )


class QuotaGate:
    def __init__(self, redis: Redis, on_redis_error: str = "fail_open", ttl: float = 0.5):
        self._quotas = Quotas(redis)
        self._fail_open = on_redis_error == "fail_open"
        self._ttl = ttl
        # tenant -> (read at, its state)
        self._cache: dict[str, tuple[float, QuotaState]] = {}

    async def _state(self, tenant: str) -> QuotaState:
        now = time.monotonic()
        cached = self._cache.get(tenant)
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        state = await self._quotas.state(tenant)
        if len(self._cache) > 10_000:
            self._cache = {t: v for t, v in self._cache.items() if now - v[0] < self._ttl}
        self._cache[tenant] = (now, state)
        return state

    async def check(self, tenant: str) -> None:
        try:
            state = await self._state(tenant)
        except STORE_FAILURES as exc:
            QUOTA_CHECKS.labels("redis_error").inc()
            if not unreachable(exc):
                raise refused("quota store", exc) from exc
            log.warning("quota_unchecked", tenant=tenant, error=str(exc))
            if self._fail_open:
                return
            raise unavailable("quota checks are temporarily unavailable") from exc
        if state.exhausted:
            QUOTA_CHECKS.labels("exhausted").inc()
            raise insufficient_quota(state.exhausted)
        QUOTA_CHECKS.labels("ok").inc()
