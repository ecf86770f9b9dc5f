"""KV-cache utilisation: a replica with free KV blocks admits without preempting.

Absolute (1 - usage) rather than ranked: 40% against 45% is no reason to move.
"""

from maas_services.router.endpoints import Endpoint
from maas_services.router.plugin import PickContext


class KvCacheScorer:
    def score(self, ctx: PickContext, endpoints: list[Endpoint]) -> list[float]:
        return [1.0 - min(max(e.kv_cache_usage, 0.0), 1.0) for e in endpoints]
