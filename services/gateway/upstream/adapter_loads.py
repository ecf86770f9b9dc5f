"""On-demand LoRA adapter loads: the replica picked for a request lacks its adapter.

The engine answers a Generate naming an adapter it has not loaded with
NOT_FOUND; for an adapter the routing table lists (it has a source), the
engine client then asks that replica to LoadAdapter and sends the request
again, once (engine_client.py). An adapter loaded by flag (--lora-modules)
has no source here and is never loaded by the gateway.

A load is shared work: it reads the adapter's files, takes an adapter slot
and may push another tenant's idle adapter out of the engine's cache. So it
is bounded per tenant, across the gateway's replicas:
- at most one load in flight per tenant: a second, for another adapter or
  replica, is refused at once;
- at most `per_minute` loads in any minute (the tenant's
  adapter_loads_per_minute, else the gateway's).
Both are the rate limiter's (rate_limiter.py), in Redis: its RPM and
concurrency, counted in one script call under a tenant of their own,
`<tenant>/adapter-loads` (no tenant can have that name), whose lease is the
load's; so N gateway replicas together allow a tenant its budget, not N
times it. This replica also refuses a second load of a tenant it has in
flight without asking Redis. With Redis unreachable, loads follow the
limiter's rate_limit_on_redis_error: unbounded (fail_open) or 503.
Over either bound the request is refused with 429 `rate_limit_exceeded` and a
Retry-After, its own excess (OpenAI's envelope, as the fair queue's
refusals). Requests that find a load of the same adapter onto the same
replica in flight wait for it and pay nothing, whoever started it, and so do
those whose NOT_FOUND crossed a load that ended after they were sent (they
are sent again): a tenant's burst on one new adapter costs one load, and
shares its refusal.
Visibility comes first: a request reaches here only once its route resolved,
so a tenant cannot make the gateway load another tenant's private adapter
(a 404 before any load).

The load runs in a task of its own, shielded from the request that started
it: a client gone does not cancel work other requests wait on.
"""

import asyncio
import math
import time
import uuid

import grpc
from prometheus_client import Counter

from maas.v1 import engine_pb2, router_pb2
from maas_services.common.openai_api.errors import APIError, bad_request, dropped, from_upstream
from maas_services.gateway.admission.rate_limiter import RateLimiter
from maas_services.gateway.admission.store_trip import replies
from maas_services.gateway.admission.tenants import Tenant
from maas_services.gateway.routing.routing_table import Route
from maas_services.gateway.upstream.upstreams import Upstreams

LOADS = Counter(
    "maas_gateway_adapter_loads",
    "On-demand LoRA adapter loads the gateway asked engines for, by outcome",
    ["outcome"],
)
# Why a request's load was refused (DROPPED_REASON_HEADER).
BUSY_REASON = "adapter-load-in-flight"
RATE_REASON = "adapter-load-rate"
# How long a finished load is remembered: longer than a NOT_FOUND takes to come back.
LOADED_MEMORY_SECONDS = 60.0


class AdapterLoads:
    def __init__(self, upstreams: Upstreams, limiter: RateLimiter, per_minute: int, timeout: float):
        self._up = upstreams
        # Its lease outlives a load (server.py); its window is the minute.
        self._limiter = limiter
        self._per_minute = per_minute
        self._timeout = timeout
        # (endpoint id, adapter) -> the load in flight there.
        self._in_flight: dict[tuple[str, str], asyncio.Task] = {}
        # tenant -> the key of the load it started, while in flight.
        self._started_by: dict[str, tuple[str, str]] = {}
        # (endpoint id, adapter) -> when its last load finished (monotonic).
        self._loaded: dict[tuple[str, str], float] = {}

    async def load(
        self, tenant: Tenant, route: Route, pick: router_pb2.PickResponse, sent: float
    ) -> None:
        """Load route.adapter onto the picked replica, for a request `sent` (monotonic)
        there and refused NOT_FOUND; or raise the client's APIError."""
        key = (pick.endpoint_id, route.adapter)
        task = self._in_flight.get(key)
        if task is None and self._loaded.get(key, -math.inf) >= sent:
            LOADS.labels("joined").inc()
            return
        if task is None:
            if tenant.name in self._started_by:
                raise busy()
            # Registered before Redis is asked: a burst arriving meanwhile joins it.
            task = asyncio.ensure_future(self._counted_load(tenant, pick, route))
            self._in_flight[key] = task
            self._started_by[tenant.name] = key
            task.add_done_callback(lambda done: self._ended(key, tenant.name, done))
        else:
            LOADS.labels("joined").inc()
        await asyncio.shield(task)

    async def _counted_load(
        self, tenant: Tenant, pick: router_pb2.PickResponse, route: Route
    ) -> None:
        """The load, once the tenant's bounds in Redis allow it; their lease ends with it."""
        # Built unvalidated: its name is no tenant's (a "/"), so no tenant's counts share its keys.
        budget = Tenant.model_construct(
            name=f"{tenant.name}/adapter-loads",
            rpm=tenant.adapter_loads_per_minute or self._per_minute,
            max_concurrency=1,
        )
        load_id = uuid.uuid4().hex
        call = self._limiter.admit_call(budget, load_id, floor=0)
        (reply,) = await replies(call)
        if isinstance(reply, BaseException):
            # The limiter's answer to a store that failed: raised (503), or unbounded.
            self._limiter.decided(call, reply)
            await self._load(pick, route)
            return
        admitted, reason, retry_ms = reply[:3]
        if not admitted and reason == "concurrency":
            raise busy()
        if not admitted:
            LOADS.labels("refused_rate").inc()
            raise dropped(
                f"Rate limit reached for adapter loads: {budget.rpm} per minute.",
                RATE_REASON,
                retry_after=max(1, math.ceil(retry_ms / 1000)),
            )
        try:
            await self._load(pick, route)
        finally:
            await self._limiter.settle(budget, load_id, 0)

    def _ended(self, key: tuple[str, str], tenant: str, task: asyncio.Task) -> None:
        if not task.cancelled():
            task.exception()  # retrieved: its waiters may all have gone
        self._in_flight.pop(key, None)
        if self._started_by.get(tenant) == key:
            del self._started_by[tenant]

    async def _load(self, pick: router_pb2.PickResponse, route: Route) -> None:
        engine = self._up.engine(pick.address, pick.endpoint_id)
        try:
            await engine.LoadAdapter(
                engine_pb2.LoadAdapterRequest(name=route.adapter, source=route.adapter_source),
                timeout=self._timeout,
            )
        except grpc.aio.AioRpcError as exc:
            LOADS.labels(exc.code().name.lower()).inc()
            raise load_refusal(exc, route.adapter) from exc
        LOADS.labels("loaded").inc()
        now = time.monotonic()
        self._loaded = {k: at for k, at in self._loaded.items() if now - at < LOADED_MEMORY_SECONDS}
        self._loaded[(pick.endpoint_id, route.adapter)] = now


def busy() -> APIError:
    """The 429 for a second load of a tenant while one of its loads is in flight."""
    LOADS.labels("refused_in_flight").inc()
    return dropped(
        "An adapter load for this key is already in progress; retry shortly.", BUSY_REASON
    )


def load_refusal(exc: grpc.aio.AioRpcError, adapter: str) -> APIError:
    """What the client sees when its adapter could not be loaded (engine.proto's codes)."""
    code, detail = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return bad_request(
            f"The adapter '{adapter}' cannot be loaded: {detail}", param="model", code="bad_adapter"
        )
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return bad_request(
            f"The model '{adapter}' is an adapter, and its base serves no adapters.",
            param="model",
            code="model_not_supported",
        )
    return from_upstream(exc, adapter, param="model")
