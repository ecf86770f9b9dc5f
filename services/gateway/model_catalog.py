"""Which models exist right now: what the router's pool currently serves.

Cached briefly so a burst of requests costs one GetPoolStats, not one each.
"""

import time

from maas.v1 import router_pb2, router_pb2_grpc


class ModelCatalog:
    def __init__(self, router: router_pb2_grpc.RouterStub, ttl_seconds: float):
        self._router = router
        self._ttl = ttl_seconds
        self._models: dict[str, router_pb2.DeploymentStats] = {}
        self._fetched_at = float("-inf")

    async def models(self) -> dict[str, router_pb2.DeploymentStats]:
        if time.monotonic() - self._fetched_at > self._ttl:
            stats = await self._router.GetPoolStats(router_pb2.PoolStatsRequest(), timeout=5)
            self._models = {d.model: d for d in stats.deployments}
            self._fetched_at = time.monotonic()
        return self._models
