"""A fixed list of engines (local mode): one snapshot, and it never changes.

Whether each one is up is the engine link's business, not discovery's.
"""

import asyncio
from collections.abc import AsyncIterator

from maas_services.router.discovery import Snapshot, Target
from maas_services.router.endpoints import parse_static
from maas_services.router.settings import RouterSettings


class StaticSource:
    def __init__(self, targets: list[Target]):
        self._targets = targets
        self._closed = asyncio.Event()

    @classmethod
    def from_settings(cls, settings: RouterSettings) -> "StaticSource":
        return cls([Target(eid, address) for eid, address in parse_static(settings.engines)])

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        yield Snapshot(list(self._targets))
        await self._closed.wait()

    async def close(self) -> None:
        self._closed.set()
