"""Least requests: fewer requests at the replica (running, waiting or just picked) is better."""

from maas_services.router.endpoints import Endpoint
from maas_services.router.plugin import PickContext
from maas_services.router.scorers import lower_is_better


class LeastRequestsScorer:
    def score(self, ctx: PickContext, endpoints: list[Endpoint]) -> list[float]:
        return lower_is_better([e.requests for e in endpoints])
