"""How many request bytes the gateway reads and holds at once, per tenant and per replica.

One key with max_concurrency 2 once sent 150 bodies of 4 MiB at once: each
was read, json-decoded and validated before the concurrency check refused it,
and the replica went from 117 MB to 2 GB. So the bytes are reserved here
before they are read, and the reservation holds until the request is parsed
into a ParsedRequest (the route, or the gRPC front, releases it; the body's
bytes and its JSON are dropped then too):

- a tenant holds at most `max_concurrency x max_body_bytes` (as many full
  bodies as it may have requests in flight), never more than `tenant_bytes`,
  never less than one full body; a tenant without a concurrency limit gets
  `tenant_bytes`;
- the replica holds at most `total_bytes`, all tenants together.

A reservation that does not fit waits up to `wait_seconds` for others to be
released (a body is parsed in milliseconds), then is refused in OpenAI's
format: 429 with Retry-After when the tenant's own budget is full, 503 when
the replica's is. Waiters are woken on every release and take what fits:
no queue order, the wait is short and bounded.

The unit is the raw byte; what a held byte costs in memory while it is
parsed (the bytes, json.loads's objects, the pydantic model) is measured in
docs/gateway.md, which sizes `total_bytes` from it.
"""

import asyncio
from dataclasses import dataclass

from prometheus_client import Counter, Gauge

from maas_services.common.openai_api.errors import APIError, unavailable
from maas_services.gateway.admission.tenants import Tenant

HELD = Gauge("maas_gateway_body_bytes_held", "Request bytes reserved while read and parsed")
REFUSED = Counter(
    "maas_gateway_body_budget_refusals",
    "Reads refused for lack of byte budget, by whose budget was full",
    ["budget"],
)


@dataclass(frozen=True)
class BudgetLimits:
    total_bytes: int
    tenant_bytes: int
    body_bytes: int  # the largest body (max_body_bytes)
    wait_seconds: float

    def __post_init__(self):
        if self.total_bytes < self.body_bytes:
            raise ValueError(
                f"body_budget_bytes ({self.total_bytes}) must hold one body of max_body_bytes"
                f" ({self.body_bytes})"
            )

    @classmethod
    def from_settings(cls, settings) -> "BudgetLimits":
        return cls(
            total_bytes=settings.body_budget_bytes,
            tenant_bytes=settings.body_budget_tenant_bytes,
            body_bytes=settings.max_body_bytes,
            wait_seconds=settings.body_budget_wait_seconds,
        )

    def for_tenant(self, tenant: Tenant) -> int:
        share = self.tenant_bytes
        if tenant.max_concurrency:
            share = min(share, tenant.max_concurrency * self.body_bytes)
        return min(self.total_bytes, max(share, self.body_bytes))


class BodyBudget:
    def __init__(self, limits: BudgetLimits):
        self.limits = limits
        self.held = 0
        self._by_tenant: dict[str, int] = {}
        self._waiters: list[asyncio.Future] = []

    def lease(self, tenant: Tenant) -> "BodyLease":
        return BodyLease(self, tenant.name, self.limits.for_tenant(tenant))

    def held_by(self, tenant: str) -> int:
        return self._by_tenant.get(tenant, 0)

    async def _reserve(self, tenant: str, limit: int, nbytes: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.wait_seconds
        while not self._fits(tenant, limit, nbytes):
            if loop.time() >= deadline:
                raise self._refusal(tenant, limit, nbytes)
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, deadline - loop.time())
            except TimeoutError:
                pass  # checked once more: a release may have come with the deadline
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self._by_tenant[tenant] = self.held_by(tenant) + nbytes
        self.held += nbytes
        HELD.set(self.held)

    def _fits(self, tenant: str, limit: int, nbytes: int) -> bool:
        return (
            self.held_by(tenant) + nbytes <= limit and self.held + nbytes <= self.limits.total_bytes
        )

    def _refusal(self, tenant: str, limit: int, nbytes: int) -> APIError:
        if self.held_by(tenant) + nbytes > limit:
            REFUSED.labels("tenant").inc()
            return APIError(
                429,
                f"Your requests' bodies already hold {limit} bytes on this server, your"
                " concurrency's share; retry when they are answered.",
                type="rate_limit_error",
                code="body_budget_exceeded",
                headers={"Retry-After": "1"},
            )
        REFUSED.labels("replica").inc()
        return unavailable("The server is reading too many request bodies; retry shortly.")

    def _free(self, tenant: str, nbytes: int) -> None:
        left = self.held_by(tenant) - nbytes
        if left:
            self._by_tenant[tenant] = left
        else:
            self._by_tenant.pop(tenant, None)
        self.held -= nbytes
        HELD.set(self.held)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class BodyLease:
    """One request's bytes in the budget: grown before bytes are read, released once parsed."""

    def __init__(self, budget: BodyBudget, tenant: str, limit: int):
        self._budget = budget
        self._tenant = tenant
        self.limit = limit
        self.held = 0

    async def grow(self, nbytes: int) -> None:
        """Reserve nbytes more, waiting a bounded time; APIError 429/503 if they never fit."""
        await self._budget._reserve(self._tenant, self.limit, nbytes)
        self.held += nbytes

    def shrink_to(self, nbytes: int) -> None:
        """Give back what was reserved beyond nbytes (a gRPC message smaller than the limit)."""
        if nbytes < self.held:
            self._budget._free(self._tenant, self.held - nbytes)
            self.held = nbytes

    def release(self) -> None:
        """Give everything back; called again, it does nothing."""
        self.shrink_to(0)
