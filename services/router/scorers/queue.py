"""Queue depth: fewer requests waiting in the engine's queue is better."""

from maas_services.router.endpoints import Endpoint
from maas_services.router.plugin import PickContext
from maas_services.router.scorers import lower_is_better


class QueueScorer:
    def score(self, ctx: PickContext, endpoints: list[Endpoint]) -> list[float]:
        return lower_is_better([e.waiting for e in endpoints])
