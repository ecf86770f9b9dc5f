"""maas.v1.Router: Pick, Release and pool statistics."""

import time

import grpc
from prometheus_client import Counter, Histogram

from maas.v1 import router_pb2, router_pb2_grpc
from services.common.metrics import LATENCY_BUCKETS
from services.router.least_load import pick_least_loaded
from services.router.pool import EnginePool

PICK_SECONDS = Histogram(
    "maas_router_pick_seconds", "Time to choose an endpoint", buckets=LATENCY_BUCKETS
)
PICKS = Counter("maas_router_picks", "Pick outcomes", ["model", "outcome"])


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(self, pool: EnginePool):
        self._pool = pool

    async def Pick(self, request, context):
        started = time.perf_counter()
        endpoints = self._pool.for_model(request.model)
        if not endpoints:
            PICKS.labels("unknown", "model_not_found").inc()
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"no engine serves model {request.model!r}"
            )
        excluded = set(request.exclude_endpoint_ids)
        candidates = [e for e in endpoints if e.available and e.endpoint_id not in excluded]
        chosen = pick_least_loaded(candidates)
        if chosen is None:
            PICKS.labels(request.model, "no_endpoint").inc()
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"no ready engine for model {request.model!r} "
                f"({len(endpoints)} known, {len(excluded)} excluded)",
            )
        self._pool.record_pick(request.request_id, chosen)
        PICKS.labels(request.model, "picked").inc()
        PICK_SECONDS.observe(time.perf_counter() - started)
        return router_pb2.PickResponse(endpoint_id=chosen.endpoint_id, address=chosen.address)

    async def Release(self, request, context):
        self._pool.release(request.request_id)
        return router_pb2.ReleaseResponse()

    async def GetPoolStats(self, request, context):
        models = [request.model] if request.model else self._pool.models()
        deployments = []
        for model in models:
            endpoints = self._pool.for_model(model)
            replicas = [
                router_pb2.ReplicaStats(
                    endpoint_id=e.endpoint_id,
                    address=e.address,
                    ready=e.ready,
                    draining=e.draining,
                    running=e.running,
                    waiting=e.waiting,
                    in_flight=e.in_flight,
                    kv_cache_usage=e.kv_cache_usage,
                    max_num_seqs=e.max_num_seqs,
                )
                for e in endpoints
            ]
            deployments.append(
                router_pb2.DeploymentStats(
                    model=model,
                    replicas=replicas,
                    queue_depth=sum(e.waiting for e in endpoints),
                    ready_replicas=sum(e.available for e in endpoints),
                )
            )
        return router_pb2.PoolStats(deployments=deployments)
