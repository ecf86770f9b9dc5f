"""maas.v1.Router: Pick, Release and pool statistics."""

import time

import grpc
from prometheus_client import Counter, Histogram

from maas.v1 import router_pb2, router_pb2_grpc
from maas_services.common import serves
from maas_services.common.logging import get_logger
from maas_services.common.metrics import LATENCY_BUCKETS
from maas_services.router.held import HeldReportRefused, HeldRequests
from maas_services.router.plugin import PickContext
from maas_services.router.pool import EnginePool
from maas_services.router.scheduler import Scheduler
from maas_services.router.scorers.adapter import placement
from maas_services.router.stats import COLLECTOR, deployment_stats

log = get_logger(__name__)

PICK_SECONDS = Histogram(
    "maas_router_pick_seconds", "Time to choose an endpoint", buckets=LATENCY_BUCKETS
)
PICKS = Counter("maas_router_picks", "Pick outcomes", ["model", "policy", "outcome"])
PREFIX_MATCH = Histogram(
    "maas_router_pick_prefix_match_ratio",
    "Share of the prompt's blocks the chosen replica was believed to cache",
    buckets=(0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0),
)

ADAPTER_PICKS = Counter(
    "maas_router_adapter_picks",
    "Picks for a LoRA adapter, by whether the chosen replica held it (loaded), had "
    "room to load it (room) or must evict another to load it (evict)",
    ["model", "placement"],
)


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(self, pool: EnginePool, scheduler: Scheduler, held: HeldRequests | None = None):
        self._pool = pool
        self._scheduler = scheduler
        self._held = held or HeldRequests()
        COLLECTOR.sources.add(self)

    async def Pick(self, request, context):
        started = time.perf_counter()
        endpoints = self._pool.for_model(request.model)
        if not endpoints:
            PICKS.labels("unknown", "", "model_not_found").inc()
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"no engine serves model {request.model!r}"
            )
        need = request.serve or serves.GENERATE
        endpoints = [e for e in endpoints if need in serves.offered(e.serves)]
        profile = self._scheduler.profile(request.model, self._pool.routing.get(request.model))
        ctx = PickContext(
            request_id=request.request_id,
            model=request.model,
            token_ids=request.token_ids,
            session_id=request.session_id,
            tenant=request.tenant,
            share_prefix_cache=request.share_prefix_cache,
            adapter=request.adapter,
            exclude=frozenset(request.exclude_endpoint_ids),
        )
        decision = profile.pick(ctx, endpoints)
        if decision is None:
            PICKS.labels(request.model, profile.policy.name, "no_endpoint").inc()
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"no ready engine for model {request.model!r} that serves {need!r} "
                f"({len(endpoints)} known, {len(ctx.exclude)} excluded)",
            )
        chosen = decision.endpoint
        if ctx.adapter:
            ADAPTER_PICKS.labels(request.model, placement(ctx.adapter, chosen)).inc()
        self._pool.record_pick(chosen, ctx.adapter, ctx.now)
        # Until the engine's events say so, assume it will cache what it was sent.
        self._pool.history.record(chosen.endpoint_id, ctx.block_hashes(chosen), ctx.now)
        PICKS.labels(request.model, profile.policy.name, "picked").inc()
        log.debug(
            "picked",
            request_id=request.request_id,
            endpoint=chosen.endpoint_id,
            scores={name: round(score, 3) for name, score in decision.scores.items()},
            loads={e.endpoint_id: e.requests for e in endpoints},
        )
        if "prefix" in decision.scores:
            PREFIX_MATCH.observe(decision.scores["prefix"])
        PICK_SECONDS.observe(time.perf_counter() - started)
        return router_pb2.PickResponse(endpoint_id=chosen.endpoint_id, address=chosen.address)

    async def Release(self, request, context):
        # A gateway older than the one-way request path still sends it at each
        # request's end, ignored: the engine's load reports end picks now
        # (endpoints.py). success=false is a gateway's word that the replica
        # failed under a request (a broken stream it migrates): out of picking
        # now, until its next load report answers (engine_link.py).
        endpoint = self._pool.endpoints.get(request.endpoint_id)
        if not request.success and endpoint is not None and endpoint.reachable:
            log.warning(
                "engine_failed_under_request",
                endpoint=endpoint.endpoint_id,
                request_id=request.request_id,
            )
            endpoint.reachable = False
        return router_pb2.ReleaseResponse()

    async def GetPoolStats(self, request, context):
        return self.pool_stats(request.model)

    async def ReportHeld(self, request, context):
        try:
            self._held.report(request.gateway_id, dict(request.held), request.ttl_seconds)
        except HeldReportRefused as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return router_pb2.HeldReportResponse()

    def pool_stats(self, model: str = "") -> router_pb2.PoolStats:
        models = [model] if model else self._pool.models()
        return router_pb2.PoolStats(
            deployments=[
                deployment_stats(
                    m,
                    self._pool.for_model(m),
                    self._pool.index,
                    self._scheduler.profile(m, self._pool.routing.get(m)).policy.name,
                    self._held.held(m),
                )
                for m in models
            ]
        )
