"""Queue depth: fewer requests waiting in the engine's queue is better."""

from services.router.endpoints import Endpoint
from services.router.plugin import PickContext
from services.router.scorers import lower_is_better


class QueueScorer:
    def score(self, ctx: PickContext, endpoints: list[Endpoint]) -> list[float]:
        return lower_is_better([e.waiting for e in endpoints])
