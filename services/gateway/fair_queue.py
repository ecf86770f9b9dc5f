"""Fair admission to one deployment: a fixed number of slots, a bounded queue.

Waiting requests are ordered by start-time fair queuing (SFQ): a tenant's
request gets the start tag max(virtual time, its tenant's last finish tag) and
the tenant's finish tag moves on by 1 / weight. Slots go to the lowest start
tag. A tenant with 50 requests queued has tags far in the future, so another
tenant's first request lands near the head of the queue instead of behind all
50; with weights, a premium tenant (weight 4) gets four requests through for
each of a weight-1 tenant's while both are backlogged.

A request costs its number of sequences (n), not its tokens: it holds that
many slots for its whole length, since it takes that many places in an
engine's batch, and its tenant's finish tag moves on by cost / weight. The
head of the queue waits until its cost fits; requests behind it do not
overtake, so a large request is never starved by small ones. A request larger
than every slot runs alone.

One queue lives in each gateway replica; slots are this replica's share of
the deployment's capacity.
"""

import asyncio
import heapq
import itertools
import time
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import LATENCY_BUCKETS

WAIT_SECONDS = Histogram(
    "maas_gateway_queue_wait_seconds",
    "Time from arrival to a free slot",
    ["deployment"],
    buckets=LATENCY_BUCKETS,
)
DEPTH = Gauge("maas_gateway_queue_depth", "Requests waiting for a slot", ["deployment"])
SHED = Counter("maas_gateway_queue_rejected", "Requests refused by the queue", ["reason"])


class QueueFullError(Exception):
    pass


class QueueTimeoutError(Exception):
    pass


@dataclass(order=True)
class _Waiter:
    start_tag: float
    seq: int
    cost: int = field(compare=False)
    future: asyncio.Future = field(compare=False)


class FairQueue:
    def __init__(self, name: str, slots: int, max_waiting: int, timeout: float):
        self.name = name
        self.slots = slots
        self.in_use = 0
        self._max_waiting = max_waiting
        self._timeout = timeout
        self._heap: list[_Waiter] = []
        self._waiting = 0
        self._virtual_time = 0.0
        self._finish_tags: dict[str, float] = {}
        self._seq = itertools.count()

    @property
    def waiting(self) -> int:
        return self._waiting

    def resize(self, slots: int) -> None:
        """Capacity changed (replicas came or went): hand out any new slots now."""
        self.slots = max(slots, 1)
        self._dispatch()

    async def acquire(self, tenant: str, weight: float, cost: int = 1) -> float:
        """Wait for `cost` slots; returns the seconds waited. Pair with release(cost)."""
        arrived = time.perf_counter()
        if not self._waiting and self._fits(cost):
            self.in_use += cost
            WAIT_SECONDS.labels(self.name).observe(0.0)
            return 0.0
        if self._waiting >= self._max_waiting:
            SHED.labels("full").inc()
            raise QueueFullError(f"the queue for {self.name!r} is full")
        start = max(self._virtual_time, self._finish_tags.get(tenant, 0.0))
        self._finish_tags[tenant] = start + cost / weight
        future = asyncio.get_running_loop().create_future()
        waiter = _Waiter(start, next(self._seq), cost, future)
        heapq.heappush(self._heap, waiter)
        self._set_waiting(self._waiting + 1)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), self._timeout)
        except BaseException as exc:
            self._abandon(waiter)
            if isinstance(exc, TimeoutError):
                SHED.labels("timeout").inc()
                raise QueueTimeoutError(
                    f"no capacity for {self.name!r} within {self._timeout:g}s"
                ) from None
            raise
        waited = time.perf_counter() - arrived
        WAIT_SECONDS.labels(self.name).observe(waited)
        return waited

    def release(self, cost: int = 1) -> None:
        self.in_use -= cost
        self._dispatch()

    def _fits(self, cost: int) -> bool:
        return self.in_use == 0 or self.in_use + cost <= self.slots

    def _abandon(self, waiter: _Waiter) -> None:
        if waiter.future.done() and not waiter.future.cancelled():
            # The slots were granted just as the waiter gave up: hand them on.
            self.release(waiter.cost)
            return
        waiter.future.cancel()
        self._set_waiting(self._waiting - 1)
        # It may have been the head that others waited behind.
        self._dispatch()

    def _dispatch(self) -> None:
        while self._heap:
            waiter = self._heap[0]
            if not waiter.future.cancelled():
                if not self._fits(waiter.cost):
                    break
                self._virtual_time = waiter.start_tag
                self.in_use += waiter.cost
                self._set_waiting(self._waiting - 1)
                waiter.future.set_result(None)
            heapq.heappop(self._heap)
        if not self._heap:
            # Idle: every tenant starts level again, and old tags cannot pile up.
            self._finish_tags.clear()
            self._virtual_time = 0.0

    def _set_waiting(self, count: int) -> None:
        self._waiting = count
        DEPTH.labels(self.name).set(count)
