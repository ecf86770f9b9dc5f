"""Adapter affinity (llm-d's LoRA affinity): for a request naming a LoRA adapter,
a replica that holds it scores 1, one with room to load it without evicting
another (fewer held than max_loras) 0.5, the rest 0.

Loading costs the request its first token's wait and may evict an adapter
someone else is using, so the policy weighs this above every load scorer
together, as it does a full prefix match (policies.py): load wins only
through the overload guard. A replica picked for an adapter counts as holding
it until its next load report (endpoints.py), so a burst for a new adapter
fills one replica up to the guard before a second one loads it. What a replica
holds follows its KV events' adapter loads and unloads at once, and its load
reports (kv_events.py). A base request has no preference.
"""

from maas_services.router.endpoints import Endpoint
from maas_services.router.plugin import PickContext

LOADED, ROOM, EVICT = "loaded", "room", "evict"
SCORES = {LOADED: 1.0, ROOM: 0.5, EVICT: 0.0}


def placement(adapter: str, endpoint: Endpoint) -> str:
    """What sending a request for `adapter` to this replica costs it: nothing
    (loaded), a load (room), or a load that evicts another adapter (evict)."""
    loaded = endpoint.loaded_adapters
    if adapter in loaded:
        return LOADED
    return ROOM if len(loaded) < endpoint.max_loras else EVICT


class AdapterScorer:
    def score(self, ctx: PickContext, endpoints: list[Endpoint]) -> list[float]:
        if not ctx.adapter:
            return [0.0] * len(endpoints)
        return [SCORES[placement(ctx.adapter, e)] for e in endpoints]
