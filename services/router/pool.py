"""The router's view of the engine pool: discovery snapshots in, endpoints out.

Each snapshot is diffed against the pool: a new replica gets an EngineLink
(load polling + KV events), a vanished one loses its link, index entries and
routing history. Picks are counted per replica until the replica's next load
report (endpoints.py).
"""

import asyncio

from maas_services.common.logging import get_logger
from maas_services.router.discovery import EndpointSource, Routing, Snapshot, Target
from maas_services.router.endpoints import Endpoint
from maas_services.router.engine_link import EngineLink
from maas_services.router.pick_history import PickHistory
from maas_services.router.prefix_index import PrefixIndex
from maas_services.router.settings import RouterSettings

log = get_logger(__name__)


class EnginePool:
    def __init__(self, source: EndpointSource, settings: RouterSettings):
        self._source = source
        self._settings = settings
        self.index = PrefixIndex()
        self.history = PickHistory(settings.history_ttl_seconds, settings.history_max_blocks)
        self.endpoints: dict[str, Endpoint] = {}
        self.routing: dict[str, Routing] = {}
        self._links: dict[str, EngineLink] = {}
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        """Apply the first snapshot and poll every engine once, so the first Pick
        already knows which models exist; later snapshots apply in the background."""
        snapshots = aiter(self._source.snapshots())
        await self.apply(await anext(snapshots))
        await asyncio.gather(*(link.poll_once() for link in self._links.values()))
        self._tasks = [asyncio.create_task(self._follow(snapshots))]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._source.close()
        await asyncio.gather(*(link.close() for link in self._links.values()))
        self._links.clear()

    async def apply(self, snapshot: Snapshot) -> None:
        self.routing = dict(snapshot.routing)
        wanted = {t.endpoint_id: t for t in snapshot.targets}
        for endpoint_id, link in list(self._links.items()):
            target = wanted.get(endpoint_id)
            # An address change is a different process: start over.
            if target is None or target.address != link.endpoint.address:
                await self._remove(endpoint_id)
        for target in wanted.values():
            if target.endpoint_id in self.endpoints:
                self._update(self.endpoints[target.endpoint_id], target)
            else:
                self._add(target)

    def for_model(self, model: str) -> list[Endpoint]:
        return [e for e in self.endpoints.values() if e.model == model]

    def models(self) -> list[str]:
        return sorted({e.model for e in self.endpoints.values() if e.model})

    @staticmethod
    def record_pick(endpoint: Endpoint, adapter: str = "", now: float = 0.0) -> None:
        """`now`: the pick's time (PickContext.now), for an adapter it names."""
        endpoint.picked_since_poll += 1
        if adapter:
            endpoint.adapters_picked[adapter] = now

    def _add(self, target: Target) -> None:
        endpoint = Endpoint(
            endpoint_id=target.endpoint_id,
            address=target.address,
            model=target.model,
            block_size=self._settings.block_size,
        )
        self._update(endpoint, target)
        self.endpoints[target.endpoint_id] = endpoint
        link = EngineLink(endpoint, self.index, self.history, self._settings.poll_interval_seconds)
        self._links[target.endpoint_id] = link
        link.start()
        log.info("endpoint_added", endpoint=target.endpoint_id, address=target.address)

    def _update(self, endpoint: Endpoint, target: Target) -> None:
        endpoint.discovered_ready = target.ready
        endpoint.terminating = target.terminating
        if target.model:
            endpoint.model = target.model

    async def _remove(self, endpoint_id: str) -> None:
        self.endpoints.pop(endpoint_id)
        await self._links.pop(endpoint_id).close()
        log.info("endpoint_removed", endpoint=endpoint_id)

    async def _follow(self, snapshots) -> None:
        async for snapshot in snapshots:
            await self.apply(snapshot)
