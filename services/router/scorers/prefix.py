"""Prefix affinity: the share of the prompt's leading blocks a replica already caches.

Matches the longest run of the prompt's chained block hashes, computed with the
engine's own function and parameters, against the replica's entries in the
event-driven index, or, for blocks the events don't (yet) cover, in the
routing history. Chaining makes the run a prefix: block k can only match if
blocks 0..k-1 did.
"""

from maas_services.router.endpoints import Endpoint
from maas_services.router.pick_history import PickHistory
from maas_services.router.plugin import PickContext
from maas_services.router.prefix_index import PrefixIndex


class PrefixScorer:
    def __init__(self, index: PrefixIndex, history: PickHistory):
        self._index = index
        self._history = history

    def matched_blocks(self, ctx: PickContext, endpoint: Endpoint) -> int:
        matched = 0
        for block_hash in ctx.block_hashes(endpoint):
            if not (
                self._index.holds(endpoint.endpoint_id, block_hash)
                or self._history.holds(endpoint.endpoint_id, block_hash, ctx.now)
            ):
                break
            matched += 1
        return matched

    def score(self, ctx: PickContext, endpoints: list[Endpoint]) -> list[float]:
        scores = []
        for endpoint in endpoints:
            total = len(ctx.block_hashes(endpoint))
            scores.append(self.matched_blocks(ctx, endpoint) / total if total else 0.0)
        return scores
