"""Which models exist right now: what the router's pool currently serves.

Cached briefly so a burst of requests costs one GetPoolStats, not one each.
After each refresh `on_endpoints` (if given) gets the endpoint id of every
replica listed, so per-endpoint state (circuit breakers) can forget replicas
that left the pool.
"""

import time
from collections.abc import Callable

from maas.v1 import router_pb2


class ModelCatalog:
    def __init__(
        self,
        router,
        ttl_seconds: float,
        on_endpoints: Callable[[set[str]], None] | None = None,
    ):
        self._router = router
        self._ttl = ttl_seconds
        self._on_endpoints = on_endpoints
        self._models: dict[str, router_pb2.DeploymentStats] = {}
        self._fetched_at = float("-inf")

    async def models(self) -> dict[str, router_pb2.DeploymentStats]:
        if time.monotonic() - self._fetched_at > self._ttl:
            stats = await self._router.GetPoolStats(router_pb2.PoolStatsRequest(), timeout=5)
            self._models = {d.model: d for d in stats.deployments}
            self._fetched_at = time.monotonic()
            if self._on_endpoints is not None:
                self._on_endpoints({r.endpoint_id for d in stats.deployments for r in d.replicas})
        return self._models
