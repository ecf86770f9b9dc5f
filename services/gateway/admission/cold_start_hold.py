"""Hold a request for a deployment with no ready replica until one is (scale to zero).

A deployment scaled to zero is not an error: the request waits here, in a
bounded queue per deployment, and this gateway replica reports how many it
holds to the router (Router.ReportHeld), whose pool queue depth the operator
reads, so the watermarks start a replica at once. The request goes on as soon
as the catalog lists a ready replica. Past the hold limit it is answered 503
with Retry-After set from the cold start this gateway last observed (how long
a hold took to end in a ready replica), less what this cold start has already
run; with none observed yet, the hold limit itself. One tenant may fill only a
share of a deployment's holds (`max_held_per_tenant`), so a tenant with a high
concurrency limit cannot make every other tenant's first request a 503.

Reports repeat while anything is held, each with a TTL, so a gateway that dies
stops counting at the router instead of keeping a replica up.
"""

import asyncio
import contextlib
import math
import os
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import Gauge, Histogram

from maas.v1 import router_pb2
from maas_services.common.logging import get_logger
from maas_services.common.openai_api.errors import unavailable

log = get_logger(__name__)

HELD = Gauge("maas_gateway_held_requests", "Requests held for a ready replica", ["deployment"])
HOLD_SECONDS = Histogram(
    "maas_gateway_hold_seconds",
    "Time a request was held for a ready replica, by how the hold ended",
    ["deployment", "outcome"],
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
)

Catalog = Callable[[], Awaitable[dict[str, router_pb2.DeploymentStats]]]
Reporter = Callable[[router_pb2.HeldReport], Awaitable[object]]


@dataclass(frozen=True)
class HoldLimits:
    max_held: int = 64  # per deployment, on this gateway replica
    max_held_per_tenant: int = 16  # of those, by one tenant
    timeout_seconds: float = 120.0
    poll_seconds: float = 0.5
    report_ttl_seconds: float = 10.0


def ready(stats: router_pb2.DeploymentStats | None) -> bool:
    """A replica takes requests now (what the admission queue is sized from)."""
    return stats is not None and any(r.ready and not r.draining for r in stats.replicas)


class ColdStartHold:
    def __init__(
        self,
        catalog: Catalog,
        report: Reporter,
        limits: HoldLimits = HoldLimits(),
        clock: Callable[[], float] = time.monotonic,
    ):
        self._catalog = catalog
        self._report = report
        self._limits = limits
        self._clock = clock
        self.gateway_id = f"{socket.gethostname()}-{os.getpid()}"
        self.held: Counter[str] = Counter()
        self._held_by: Counter[tuple[str, str]] = Counter()  # (deployment, tenant)
        self._since: dict[str, float] = {}  # deployment -> when its oldest current hold began
        self._cold_start: dict[str, float] = {}  # deployment -> last observed, seconds
        self._changed = asyncio.Event()
        self._reporter: asyncio.Task | None = None

    async def until_ready(
        self, deployment: str, tenant: str
    ) -> dict[str, router_pb2.DeploymentStats]:
        """The catalog once `deployment` has a ready replica; APIError 503 past the limits."""
        mine = self._held_by[deployment, tenant]
        if self.held[deployment] >= self._limits.max_held or (
            mine >= self._limits.max_held_per_tenant
        ):
            HOLD_SECONDS.labels(deployment, "full").observe(0)
            raise unavailable(
                f"{self.held[deployment]} requests ({mine} of them yours) already wait "
                f"for a replica of '{deployment}' to start",
                self.retry_after(deployment),
            )
        started = self._clock()
        self._enter(deployment, tenant, started)
        try:
            while True:
                catalog = await self._catalog()
                waited = self._clock() - started
                if ready(catalog.get(deployment)):
                    HOLD_SECONDS.labels(deployment, "served").observe(waited)
                    # The first hold of a cold start saw (nearly) all of it.
                    oldest = self._clock() - self._since.get(deployment, started)
                    self._cold_start[deployment] = max(oldest, waited)
                    return catalog
                if waited >= self._limits.timeout_seconds:
                    HOLD_SECONDS.labels(deployment, "timeout").observe(waited)
                    raise unavailable(
                        f"no replica of '{deployment}' became ready within "
                        f"{self._limits.timeout_seconds:g}s; one is starting",
                        self.retry_after(deployment),
                    )
                await asyncio.sleep(self._limits.poll_seconds)
        finally:
            self._leave(deployment, tenant)

    def retry_after(self, deployment: str) -> int:
        """Seconds until the cold start under way should be done, at least 1."""
        observed = self._cold_start.get(deployment)
        if observed is None:
            return max(math.ceil(self._limits.timeout_seconds), 1)
        running = self._clock() - self._since.get(deployment, self._clock())
        return max(math.ceil(observed - running), 1)

    def _enter(self, deployment: str, tenant: str, now: float) -> None:
        self._since.setdefault(deployment, now)
        self.held[deployment] += 1
        self._held_by[deployment, tenant] += 1
        HELD.labels(deployment).set(self.held[deployment])
        self._changed.set()
        if self._reporter is None or self._reporter.done():
            self._reporter = asyncio.get_running_loop().create_task(self._report_loop())

    def _leave(self, deployment: str, tenant: str) -> None:
        self._held_by[deployment, tenant] -= 1
        if self._held_by[deployment, tenant] <= 0:
            del self._held_by[deployment, tenant]
        self.held[deployment] -= 1
        HELD.labels(deployment).set(self.held[deployment])
        if self.held[deployment] <= 0:
            del self.held[deployment]
            self._since.pop(deployment, None)
        self._changed.set()

    async def _report_loop(self) -> None:
        """Report on every change, and again before the last report's TTL lapses."""
        ttl = self._limits.report_ttl_seconds
        while True:
            self._changed.clear()
            report = router_pb2.HeldReport(
                gateway_id=self.gateway_id, held=dict(self.held), ttl_seconds=ttl
            )
            try:
                await self._report(report)
            except Exception as exc:  # the hold itself still works; the router learns later
                log.warning("held_report_failed", error=str(exc)[:200])
            if not report.held:
                return  # the report of nothing held was the last one needed
            # Holds that ended while that report was in flight set _changed, so
            # the next pass reports them at once (down to the empty report).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), ttl / 3)

    async def close(self) -> None:
        if self._reporter is not None:
            self._reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reporter
