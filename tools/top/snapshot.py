"""One look at the whole stack: the router's pool stats and every /metrics page, at once."""

import asyncio
import time
from dataclasses import dataclass, field

import grpc
import httpx

from maas.v1 import router_pb2, router_pb2_grpc
from maas_services.common.grpc_client import open_channel
from maas_tools.top.scrape import Metrics, scrape
from maas_tools.top.targets import Targets

ENGINE = "engine/"  # the page key prefix of an engine replica, before its endpoint id


@dataclass
class Snapshot:
    taken: float  # time.monotonic()
    pool: router_pb2.PoolStats | None
    # "gateway", "billing" and ENGINE + endpoint id -> the page (None: unreadable);
    # a source nobody gave a URL for is absent.
    pages: dict[str, Metrics | None]
    # A local stack's child name -> restarts (empty on a cluster).
    restarts: dict[str, int] = field(default_factory=dict)

    @property
    def engine_ids(self) -> list[str]:
        return [k.removeprefix(ENGINE) for k in self.pages if k.startswith(ENGINE)]


class Collector:
    def __init__(self, targets: Targets, timeout: float = 5.0):
        self._targets = targets
        self._timeout = timeout
        self._channel = open_channel(targets.router_address, "top", targets.service_token)
        self._router = router_pb2_grpc.RouterStub(self._channel)
        self._http = httpx.AsyncClient(timeout=timeout)

    async def _pool(self) -> router_pb2.PoolStats | None:
        try:
            return await self._router.GetPoolStats(
                router_pb2.PoolStatsRequest(), timeout=self._timeout
            )
        except grpc.aio.AioRpcError:
            return None

    async def take(self) -> Snapshot:
        pool = await self._pool()
        urls = self._targets.engine_urls(pool)
        sources = {
            "gateway": self._targets.gateway_metrics,
            "billing": self._targets.billing_metrics,
            **{ENGINE + name: url for name, url in urls.items()},
        }
        sources = {name: url for name, url in sources.items() if url}
        pages = await asyncio.gather(*(scrape(self._http, url) for url in sources.values()))
        pages = dict(zip(sources, pages, strict=True))
        return Snapshot(time.monotonic(), pool, pages, self._targets.restarts())

    async def close(self) -> None:
        await self._http.aclose()
        await self._channel.close()
