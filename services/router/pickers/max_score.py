"""The best weighted score wins; ties go to the rendezvous winner for the prompt,
so router replicas break them alike and same-prefix prompts stay together."""

from maas_services.router import rendezvous
from maas_services.router.endpoints import Endpoint
from maas_services.router.plugin import PickContext

# Sums of float weights: scores this close are equal.
EPSILON = 1e-9


class MaxScorePicker:
    def pick(self, ctx: PickContext, ranked: list[tuple[Endpoint, float]]) -> Endpoint:
        best = max(score for _, score in ranked)
        tied = [e for e, score in ranked if score >= best - EPSILON]
        key = ctx.tie_key
        return max(tied, key=lambda e: rendezvous.weight(key, e.endpoint_id))
