"""The overload guard: skip replicas with more than `margin` requests above the
least-loaded candidate.

Cache affinity concentrates traffic; past some queue, waiting costs more than a
cache hit saves. Dropping those replicas before scoring lets load win exactly
then, and never otherwise. Requests (running + waiting, or this router's
in-flight count) rather than the engine's waiting queue alone: on CPU or with
large batches the waiting queue stays empty while latency already grows.
"""

from maas_services.router.endpoints import Endpoint
from maas_services.router.plugin import PickContext


class OverloadFilter:
    def __init__(self, margin: int):
        self._margin = margin

    def filter(self, ctx: PickContext, endpoints: list[Endpoint]) -> list[Endpoint]:
        if not endpoints:
            return []
        least = min(e.requests for e in endpoints)
        return [e for e in endpoints if e.requests <= least + self._margin]
