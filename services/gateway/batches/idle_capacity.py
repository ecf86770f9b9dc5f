"""When a batch line may start: only into capacity interactive requests leave idle.

Interactive requests wait for a deployment's slots in this replica's fair
queue (admission/fair_queue.py). A batch line is let through to admission
only when, on this replica, that deployment has no request waiting and no
interactive request in flight (its slots in use are batch lines only), and
after the line takes its slot a reserve of max(1, reserve_fraction x slots)
stays free; and the gate has not seen an interactive request there for
`quiet_seconds` (the gaps of a client sending one request after another are
not idle capacity). So an interactive request never queues behind batch lines (it
finds a free slot at once), and a batch line never starts beside one: while
interactive requests keep a deployment busy, its batch lines wait. One line
at a time goes through admission on a replica (the lock), so two cannot both
take the last spare slot.

What the gate cannot do is pause a batch line already running when an
interactive request arrives: they share the engine's steps until the line
ends. The engine priority (batch_run.py) orders a batch line after every
interactive sequence for scheduling and preemption; `batch_concurrency` bounds
how many run beside an arrival (benchmarks/batch_interference.py measures it).

A line whose model the gate cannot place (unknown, none running) goes on to
admission, which answers it as it would an interactive request.
"""

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import AsyncIterator

import grpc

from maas_services.gateway.admission.fair_queue import FairQueue
from maas_services.gateway.admission.tenants import Tenant
from maas_services.gateway.pipeline import Pipeline
from maas_services.gateway.routing.routing_table import NoDeploymentUpError


def batch_room(queue: FairQueue, batch_lines: int, reserve_fraction: float) -> bool:
    """Whether one more batch line may start, `batch_lines` of its slots in use
    being batch lines: none waiting, no interactive request in flight, the reserve kept."""
    if busy(queue, batch_lines):
        return False
    reserve = max(1, math.ceil(queue.slots * reserve_fraction))
    return queue.in_use + 1 <= max(queue.slots - reserve, 0) or queue.in_use == 0


def busy(queue: FairQueue, batch_lines: int) -> bool:
    """Interactive requests wait for, or hold, slots of the deployment."""
    return bool(queue.waiting) or queue.in_use > batch_lines


class IdleCapacity:
    def __init__(
        self,
        pipeline: Pipeline,
        reserve_fraction: float,
        poll_seconds: float,
        quiet_seconds: float = 0.0,
    ):
        self._pipeline = pipeline
        self._reserve = reserve_fraction
        self._poll = poll_seconds
        self._quiet = quiet_seconds
        self._admitting = asyncio.Lock()
        # When the gate last saw each deployment busy with interactive requests.
        self._busy_at: dict[str, float] = {}

    @contextlib.asynccontextmanager
    async def admitting(
        self, tenant: Tenant, model: str, batch_lines: Counter
    ) -> AsyncIterator[None]:
        """Wait for room, then hold the gate while the line is admitted.
        `batch_lines`: this replica's batch lines in flight, by deployment."""
        async with self._admitting:
            while True:
                queue = await self._queue(tenant, model)
                if queue is None or self._room(queue, batch_lines[queue.name]):
                    break
                await asyncio.sleep(self._poll)
            yield

    def _room(self, queue: FairQueue, batch_lines: int) -> bool:
        """batch_room, once the deployment has been quiet `quiet_seconds`: a closed-loop
        client's gap between two requests is not idle capacity."""
        now = time.monotonic()
        if busy(queue, batch_lines):
            self._busy_at[queue.name] = now
            return False
        if now - self._busy_at.get(queue.name, -self._quiet) < self._quiet:
            return False
        return batch_room(queue, batch_lines, self._reserve)

    async def _queue(self, tenant: Tenant, model: str) -> FairQueue | None:
        pipeline = self._pipeline
        try:
            deployments = await pipeline.catalog.models()
            route = pipeline.resolve(model, tenant, "", deployments)
        except (grpc.aio.AioRpcError, NoDeploymentUpError):
            return None
        if route is None or route.deployment not in deployments:
            return None
        return pipeline.queues.queue(route, deployments[route.deployment])
