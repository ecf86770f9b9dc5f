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

The waiting places are shared fairly too, or one tenant could fill them all
and every other tenant would be refused. A waiting request takes one place,
whatever its n. When the queue is full, a newcomer's tenant is measured
against its fair share of the places (see FairQueue._make_room): a tenant with
room in its share takes the place of the newest waiter of the tenant most over
its share (that waiter fails with FairShareError), and a tenant already at its
share is refused (FairShareError too: its own excess). Only the newest is
displaced, so a tenant's older requests keep their turn.

One queue lives in each gateway replica; slots are this replica's share of
the deployment's capacity.
"""

import asyncio
import heapq
import itertools
import time
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge, Histogram

from maas_services.common.metrics import LATENCY_BUCKETS

WAIT_SECONDS = Histogram(
    "maas_gateway_queue_wait_seconds",
    "Time from arrival to a free slot",
    ["deployment"],
    buckets=LATENCY_BUCKETS,
)
DEPTH = Gauge("maas_gateway_queue_depth", "Requests waiting for a slot", ["deployment"])
# reason: full (503), timeout (503), over_share (429, a newcomer over its
# tenant's share), displaced (429, a waiter whose place went to a tenant under its share).
SHED = Counter("maas_gateway_queue_rejected", "Requests refused by the queue", ["reason"])


class QueueFullError(Exception):
    pass


class FairShareError(QueueFullError):
    """The queue is full and the request's tenant holds its fair share of it or more:
    refused on arrival, or displaced while waiting by a tenant under its share."""


class QueueTimeoutError(Exception):
    pass


@dataclass(order=True)
class _Waiter:
    start_tag: float
    seq: int
    cost: int = field(compare=False)
    tenant: str = field(compare=False)
    future: asyncio.Future = field(compare=False)


@dataclass
class _Backlog:
    """A tenant's waiters, by arrival (seq), and the weight it came with."""

    weight: float
    waiters: dict[int, _Waiter] = field(default_factory=dict)


class FairQueue:
    def __init__(self, name: str, slots: int, max_waiting: int, timeout: float):
        self.name = name
        self.slots = slots
        self.in_use = 0
        self._max_waiting = max_waiting
        self._timeout = timeout
        self._heap: list[_Waiter] = []
        self._waiting = 0
        self._backlogs: dict[str, _Backlog] = {}
        self._virtual_time = 0.0
        self._finish_tags: dict[str, float] = {}
        self._seq = itertools.count()

    @property
    def waiting(self) -> int:
        return self._waiting

    def waiting_for(self, tenant: str) -> int:
        """The places `tenant` holds in the queue now."""
        backlog = self._backlogs.get(tenant)
        return len(backlog.waiters) if backlog else 0

    def resize(self, slots: int) -> None:
        """Capacity changed (replicas came or went): hand out any new slots now."""
        self.slots = max(slots, 1)
        self._dispatch()

    async def acquire(self, tenant: str, weight: float, cost: int = 1) -> float:
        """Wait for `cost` slots; returns the seconds waited. Pair with release(cost).

        Raises QueueFullError (FairShareError when it is the tenant's own
        excess, on arrival or displaced later) or QueueTimeoutError.
        """
        arrived = time.perf_counter()
        if not self._waiting and self._fits(cost):
            self.in_use += cost
            WAIT_SECONDS.labels(self.name).observe(0.0)
            return 0.0
        if self._waiting >= self._max_waiting:
            self._make_room(tenant, weight)
        start = max(self._virtual_time, self._finish_tags.get(tenant, 0.0))
        self._finish_tags[tenant] = start + cost / weight
        future = asyncio.get_running_loop().create_future()
        waiter = _Waiter(start, next(self._seq), cost, tenant, future)
        heapq.heappush(self._heap, waiter)
        backlog = self._backlogs.setdefault(tenant, _Backlog(weight))
        backlog.weight = weight
        backlog.waiters[waiter.seq] = waiter
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

    def _make_room(self, tenant: str, weight: float) -> None:
        """The queue is full: free a place for `tenant`'s newcomer, or refuse it.

        The P waiting places are shared by the tenants with a request waiting,
        the newcomer's tenant included, in proportion to their weights:
        share(t) = P * weight(t) / sum of those weights. With held(t) the
        places t holds now:
        - held(t) >= share(t): the newcomer is its tenant's own excess, refused
          with FairShareError (429);
        - held(t) + 1 <= share(t): the newest waiter of the tenant most over its
          share (highest held / weight, the one that started waiting first on a
          tie; over it, since the places held add up to P and t holds less than
          its share) is displaced with FairShareError, and the newcomer takes
          its place;
        - otherwise t's share leaves less than one more whole place (P = 1
          between two tenants): QueueFullError (503), as when P is 0.
        A displaced tenant keeps more than its share minus one, so while the
        same tenants wait it cannot take the place straight back: two tenants
        do not trade one place back and forth.
        """
        places = self._max_waiting
        weights = {name: backlog.weight for name, backlog in self._backlogs.items()}
        weights[tenant] = weight
        total = sum(weights.values())
        held = self.waiting_for(tenant)
        share = places * weight / total
        if places and held >= share:
            SHED.labels("over_share").inc()
            raise FairShareError(
                f"the queue for {self.name!r} is full and your requests hold {held} of "
                f"its {places} places, at or above your fair share of {share:.1f}"
            )
        if not places or held + 1 > share:
            SHED.labels("full").inc()
            raise QueueFullError(f"the queue for {self.name!r} is full")
        victim = max(
            (b for name, b in self._backlogs.items() if name != tenant),
            key=lambda b: len(b.waiters) / b.weight,
        )
        newest = victim.waiters[next(reversed(victim.waiters))]
        self._displace(newest, places * victim.weight / total)

    def _displace(self, waiter: _Waiter, share: float) -> None:
        SHED.labels("displaced").inc()
        held = self.waiting_for(waiter.tenant)
        self._leave(waiter)
        # It never ran: its tenant's finish tag goes back to where it was before
        # it came (it was that tenant's newest, so the tag was its own).
        self._finish_tags[waiter.tenant] = waiter.start_tag
        waiter.future.set_exception(
            FairShareError(
                f"your request gave its place in the full queue for {self.name!r} to "
                f"another tenant's: your requests held {held} of its {self._max_waiting} "
                f"places, above your fair share of {share:.1f}"
            )
        )
        # It may have been the head that others waited behind.
        self._dispatch()

    def _fits(self, cost: int) -> bool:
        return self.in_use == 0 or self.in_use + cost <= self.slots

    def _abandon(self, waiter: _Waiter) -> None:
        future = waiter.future
        if future.done() and not future.cancelled():
            if future.exception() is None:
                # The slots were granted just as the waiter gave up: hand them on.
                self.release(waiter.cost)
            # Else displaced: it already left the queue.
            return
        future.cancel()
        self._leave(waiter)
        # It may have been the head that others waited behind.
        self._dispatch()

    def _leave(self, waiter: _Waiter) -> None:
        """Take a waiter's place back; its heap entry is dropped when it reaches the head."""
        backlog = self._backlogs[waiter.tenant]
        del backlog.waiters[waiter.seq]
        if not backlog.waiters:
            del self._backlogs[waiter.tenant]
        self._set_waiting(self._waiting - 1)

    def _dispatch(self) -> None:
        while self._heap:
            waiter = self._heap[0]
            if not waiter.future.done():
                if not self._fits(waiter.cost):
                    break
                self._virtual_time = waiter.start_tag
                self.in_use += waiter.cost
                self._leave(waiter)
                waiter.future.set_result(None)
            heapq.heappop(self._heap)
        if not self._heap:
            # Idle: every tenant starts level again, and old tags cannot pile up.
            self._finish_tags.clear()
            self._virtual_time = 0.0

    def _set_waiting(self, count: int) -> None:
        self._waiting = count
        DEPTH.labels(self.name).set(count)
