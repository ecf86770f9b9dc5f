"""The price table billing publishes, as the gateway reads it to reserve prepaid requests.

Billing loads its --prices-file and SETs the table at PRICES_KEY
(services/common/prices.py) whenever its consumer (re)starts, so the gateway
prices a request's most with the table the ledger will charge it by. Read at
most once per `ttl` per replica: prices change with a billing rollout, not per
request. None while billing has published nothing (a stack whose billing has
not started yet): the quota gate then reserves nothing for the price
(quota_gate.py) and counts it.
"""

import time

from pydantic import ValidationError
from redis.asyncio import Redis

from maas_services.common.logging import get_logger
from maas_services.common.prices import PRICES_KEY, PriceTable

log = get_logger(__name__)


class PublishedPrices:
    def __init__(self, redis: Redis, ttl: float = 5.0):
        self._redis = redis
        self._ttl = ttl
        self._read_at: float | None = None
        self._table: PriceTable | None = None

    async def table(self) -> PriceTable | None:
        now = time.monotonic()
        if self._read_at is not None and now - self._read_at < self._ttl:
            return self._table
        raw = await self._redis.get(PRICES_KEY)
        try:
            self._table = None if raw is None else PriceTable.model_validate_json(raw)
        except ValidationError as exc:
            # Billing wrote it; a table it cannot have meant is no table.
            log.error("published_prices_unreadable", error=str(exc))
            self._table = None
        self._read_at = now
        return self._table
