"""On-demand LoRA adapter loads: the replica picked for a request lacks its adapter.

The engine answers a Generate naming an adapter it has not loaded with
NOT_FOUND; for an adapter the routing table lists (it has a source), the
engine client then asks that replica to LoadAdapter and sends the request
again, once (engine_client.py). An adapter loaded by flag (--lora-modules)
has no source here and is never loaded by the gateway.

A load is shared work: it reads the adapter's files, takes an adapter slot
and may push another tenant's idle adapter out of the engine's cache. So it
is bounded per tenant, on each gateway replica:
- at most one load in flight per tenant: a second, for another adapter or
  replica, is refused at once;
- a token bucket of `per_minute` loads a minute (the tenant's
  adapter_loads_per_minute, else the gateway's), holding at most a minute's.
Over either bound the request is refused with 429 `rate_limit_exceeded` and a
Retry-After, its own excess (OpenAI's envelope, as the fair queue's
refusals). Requests that find a load of the same adapter onto the same
replica in flight wait for it and pay nothing, whoever started it, and so do
those whose NOT_FOUND crossed a load that ended after they were sent (they
are sent again): a tenant's burst on one new adapter costs one load.
Visibility comes first: a request reaches here only once its route resolved,
so a tenant cannot make the gateway load another tenant's private adapter
(a 404 before any load).

The load runs in a task of its own, shielded from the request that started
it: a client gone does not cancel work other requests wait on.
"""

import asyncio
import math
import time
from dataclasses import dataclass

import grpc
from prometheus_client import Counter

from maas.v1 import engine_pb2, router_pb2
from maas_services.common.openai_api.errors import APIError, bad_request, dropped, from_upstream
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


@dataclass
class _Bucket:
    tokens: float
    at: float


class AdapterLoads:
    def __init__(self, upstreams: Upstreams, per_minute: int, timeout: float):
        self._up = upstreams
        self._per_minute = per_minute
        self._timeout = timeout
        # (endpoint id, adapter) -> the load in flight there.
        self._in_flight: dict[tuple[str, str], asyncio.Task] = {}
        # tenant -> the key of the load it started, while in flight.
        self._started_by: dict[str, tuple[str, str]] = {}
        # (endpoint id, adapter) -> when its last load finished (monotonic).
        self._loaded: dict[tuple[str, str], float] = {}
        # One per tenant that has caused a load: bounded by the tenants, not by requests.
        self._buckets: dict[str, _Bucket] = {}

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
            self._take(tenant)
            task = asyncio.ensure_future(self._load(pick, route))
            self._in_flight[key] = task
            self._started_by[tenant.name] = key
            task.add_done_callback(lambda done: self._ended(key, tenant.name, done))
        else:
            LOADS.labels("joined").inc()
        await asyncio.shield(task)

    def _take(self, tenant: Tenant) -> None:
        """Count a load against the tenant's bounds, or raise its 429."""
        if tenant.name in self._started_by:
            LOADS.labels("refused_in_flight").inc()
            raise dropped(
                "An adapter load for this key is already in progress; retry shortly.",
                BUSY_REASON,
            )
        per_minute = tenant.adapter_loads_per_minute or self._per_minute
        now = time.monotonic()
        bucket = self._buckets.get(tenant.name) or _Bucket(per_minute, now)
        bucket.tokens = min(per_minute, bucket.tokens + (now - bucket.at) * per_minute / 60)
        bucket.at = now
        self._buckets[tenant.name] = bucket
        if bucket.tokens < 1:
            LOADS.labels("refused_rate").inc()
            wait = math.ceil((1 - bucket.tokens) * 60 / per_minute)
            raise dropped(
                f"Rate limit reached for adapter loads: {per_minute} per minute.",
                RATE_REASON,
                retry_after=wait,
            )
        bucket.tokens -= 1

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
