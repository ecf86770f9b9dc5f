"""Keeps the usage stream short: trims what every consumer group has acked.

The gateway XADDs without MAXLEN on purpose: a length cap would drop entries
billing has not read yet. Instead billing trims below the oldest entry any
group still needs, the lower of its oldest pending entry (XPENDING) and the
entry after the last one it was delivered (XINFO GROUPS). Groups are read
before the trim: whatever is delivered or claimed meanwhile lies above that
bound, so a pending or unread entry is never trimmed. Every group of the
stream counts, not only billing's. Each round also samples Redis memory, so
its use against maxmemory is on billing's /metrics (the chart's alert), and
billing's lag (maas_billing_lag_seconds, 0 when nothing waits): the age of the
oldest entry a group has yet to commit. Billing's Redis user may not read
entries (no XRANGE), so the age comes from ids it reads anyway: the oldest
pending entry's, or, when entries wait unread, the last delivered one's (the
first unread came after it: a bound within one delivery's gap).

`run` is supervised as the consumer's is: a round that fails, for any reason
(Redis down, or a reply it cannot read), is logged, counted in
maas_billing_trimmer_restarts_total and retried with the consumer's capped
exponential backoff, forever; a trimmer that died would let the stream grow
until Redis refuses the gateway's writes.
"""

import time

from prometheus_client import Counter, Gauge
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError
from tenacity import RetryCallState

from maas_services.billing.periodic import every
from maas_services.common.logging import get_logger

log = get_logger(__name__)

TRIMMED = Counter("maas_billing_stream_trimmed_entries", "Acknowledged usage entries trimmed")
LENGTH = Gauge("maas_billing_stream_entries", "Entries in the usage stream (XLEN)")
USED = Gauge("maas_redis_memory_used_bytes", "Redis used_memory, sampled by billing")
LIMIT = Gauge("maas_redis_memory_max_bytes", "Redis maxmemory (0 = none), sampled by billing")
LAG = Gauge(
    "maas_billing_lag_seconds",
    "Age of the oldest usage event not yet committed (pending or unread); 0 when none",
)
RESTARTS = Counter(
    "maas_billing_trimmer_restarts", "Trim rounds that failed and were retried", ["error"]
)


def _parse(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


class StreamTrimmer:
    def __init__(self, redis: Redis, stream: str, interval_seconds: float):
        self._redis = redis
        self._stream = stream
        self._interval = interval_seconds

    async def trim_floor(self) -> str | None:
        """The lowest id some group still needs; None while there is no group."""
        floor, _ = await self._needs()
        return floor

    async def _needs(self) -> tuple[str | None, float | None]:
        """The lowest id some group still needs, and the Unix time of the oldest
        entry a group has yet to commit, were any left (the lag's start)."""
        try:
            groups = await self._redis.xinfo_groups(self._stream)
        except ResponseError:
            return None, None  # no stream yet
        floors, oldest_ms = [], []
        for group in groups:
            ms, seq = _parse(group["last-delivered-id"])
            floor = (ms, seq + 1)
            oldest_ms.append(ms)  # the first unread, if any, came after it
            if group["pending"]:
                oldest = (await self._redis.xpending(self._stream, group["name"]))["min"]
                if oldest is not None:
                    floor = min(floor, _parse(oldest))
                    oldest_ms[-1] = floor[0]
            floors.append(floor)
        if not floors:
            return None, None
        ms, seq = min(floors)
        return f"{ms}-{seq}", min(oldest_ms) / 1000

    async def trim_once(self) -> int:
        floor, oldest = await self._needs()
        trimmed = 0
        if floor is not None:
            trimmed = await self._redis.xtrim(self._stream, minid=floor, approximate=False)
            TRIMMED.inc(trimmed)
        length = await self._redis.xlen(self._stream)
        LENGTH.set(length)
        # Trimmed, the stream holds only what some group still needs.
        LAG.set(max(0.0, time.time() - oldest) if length and oldest else 0.0)
        memory = await self._redis.info("memory")
        USED.set(memory["used_memory"])
        LIMIT.set(memory["maxmemory"])
        return trimmed

    async def run(self) -> None:
        """Trim every interval until cancelled; no failure ends it."""
        await every(self._interval, self.trim_once, _failed)


def _failed(state: RetryCallState) -> None:
    error = state.outcome.exception()
    RESTARTS.labels(type(error).__name__).inc()
    log.warning(
        "stream_trim_failed",
        error=str(error),
        error_type=type(error).__name__,
        attempt=state.attempt_number,
        retry_in_seconds=round(state.upcoming_sleep, 2),
        # A Redis error explains itself (the consumer reports outages too);
        # anything else is a bug to trace.
        exc_info=None if isinstance(error, RedisError) else error,
    )
