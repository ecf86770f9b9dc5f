"""Apply one engine's KV event batches to the prefix index.

On every (re)subscription the engine first sends CLEARED then STORED with all
it caches, so the index is exact again after any reconnect, and a router that
restarts rebuilds it from nothing. An event about a block also settles the
routing-history guess for it.
"""

from prometheus_client import Counter

from maas.v1 import engine_pb2
from maas_services.router.pick_history import PickHistory
from maas_services.router.prefix_index import PrefixIndex

KIND = engine_pb2.KvEvent.Kind
KV_EVENTS = Counter("maas_router_kv_events", "KV cache events applied to the index", ["kind"])


def apply_batch(
    index: PrefixIndex, history: PickHistory, endpoint_id: str, batch: engine_pb2.KvEventBatch
) -> None:
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
        else:
            continue
        KV_EVENTS.labels(KIND.Name(event.kind).removeprefix("KIND_").lower()).inc()
