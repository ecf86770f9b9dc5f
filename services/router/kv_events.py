"""Apply one engine's KV event batches to the prefix index and its adapter set.

On every (re)subscription the engine first sends CLEARED then STORED with all
it caches, then ADAPTER_LOADED for each adapter it holds, so the index and
the adapter set are exact again after any reconnect, and a router that
restarts rebuilds them from nothing. An event about a block also settles the
routing-history guess for it.

Adapters. ADAPTER_LOADED and ADAPTER_UNLOADED change the endpoint's set at
once, between load reports (each report still replaces the set wholesale).
Only the first batch's CLEARED empties the set: that batch re-lists every
adapter, while a CLEARED later in a stream (the engine reset its prefix
cache, or the vLLM backend lost some of vLLM's events) says nothing of them.
"""

from prometheus_client import Counter

from maas.v1 import engine_pb2
from maas_services.router.endpoints import Endpoint
from maas_services.router.pick_history import PickHistory
from maas_services.router.prefix_index import PrefixIndex

KIND = engine_pb2.KvEvent.Kind
KV_EVENTS = Counter(
    "maas_router_kv_events", "KV cache and adapter events applied from engines", ["kind"]
)


def apply_batch(
    index: PrefixIndex,
    history: PickHistory,
    endpoint: Endpoint,
    batch: engine_pb2.KvEventBatch,
    first: bool = False,
) -> None:
    """first: the stream's first batch, the engine's snapshot."""
    endpoint_id = endpoint.endpoint_id
    for event in batch.events:
        hashes = list(event.block_hashes)
        if event.kind == KIND.KIND_STORED:
            index.stored(endpoint_id, hashes)
            history.forget(endpoint_id, hashes)
        elif event.kind == KIND.KIND_EVICTED:
            index.evicted(endpoint_id, hashes)
            history.forget(endpoint_id, hashes)
        elif event.kind == KIND.KIND_CLEARED:
            index.clear(endpoint_id)
            if first:
                endpoint.adapters = frozenset()
        elif event.kind == KIND.KIND_ADAPTER_LOADED:
            endpoint.adapters |= {event.adapter}
        elif event.kind == KIND.KIND_ADAPTER_UNLOADED:
            endpoint.adapters -= {event.adapter}
        else:
            continue
        KV_EVENTS.labels(KIND.Name(event.kind).removeprefix("KIND_").lower()).inc()
