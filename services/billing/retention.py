"""Keeps the usage stream short: trims what every consumer group has acked.

The gateway XADDs without MAXLEN on purpose: a length cap would drop entries
billing has not read yet. Instead billing trims below the oldest entry any
group still needs, the lower of its oldest pending entry (XPENDING) and the
entry after the last one it was delivered (XINFO GROUPS). Groups are read
before the trim: whatever is delivered or claimed meanwhile lies above that
bound, so a pending or unread entry is never trimmed. Every group of the
stream counts, not only billing's. Each round also samples Redis memory, so
its use against maxmemory is on billing's /metrics (the chart's alert).
"""

import asyncio

from prometheus_client import Counter, Gauge
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from services.common.logging import get_logger
from services.common.redis_client import honour_swallowed_cancel

log = get_logger(__name__)

TRIMMED = Counter("maas_billing_stream_trimmed_entries", "Acknowledged usage entries trimmed")
LENGTH = Gauge("maas_billing_stream_entries", "Entries in the usage stream (XLEN)")
USED = Gauge("maas_redis_memory_used_bytes", "Redis used_memory, sampled by billing")
LIMIT = Gauge("maas_redis_memory_max_bytes", "Redis maxmemory (0 = none), sampled by billing")


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
        try:
            groups = await self._redis.xinfo_groups(self._stream)
        except ResponseError:
            return None  # no stream yet
        floors = []
        for group in groups:
            ms, seq = _parse(group["last-delivered-id"])
            floor = (ms, seq + 1)
            if group["pending"]:
                oldest = (await self._redis.xpending(self._stream, group["name"]))["min"]
                if oldest is not None:
                    floor = min(floor, _parse(oldest))
            floors.append(floor)
        if not floors:
            return None
        ms, seq = min(floors)
        return f"{ms}-{seq}"

    async def trim_once(self) -> int:
        floor = await self.trim_floor()
        trimmed = 0
        if floor is not None:
            trimmed = await self._redis.xtrim(self._stream, minid=floor, approximate=False)
            TRIMMED.inc(trimmed)
        LENGTH.set(await self._redis.xlen(self._stream))
        memory = await self._redis.info("memory")
        USED.set(memory["used_memory"])
        LIMIT.set(memory["maxmemory"])
        return trimmed

    async def run(self) -> None:
        while True:
            honour_swallowed_cancel()
            try:
                await self.trim_once()
            except RedisError as exc:
                # The consumer reports Redis outages; trimming resumes with Redis.
                log.warning("stream_trim_failed", error=str(exc))
            await asyncio.sleep(self._interval)
