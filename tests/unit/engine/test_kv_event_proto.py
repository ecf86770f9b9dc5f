"""The serving process' KV events as engine.proto's: block kinds carry their hashes,
adapter kinds the adapter's name (services/engine/servicer.py, both backends)."""

from maas.v1 import engine_pb2
from maas_services.engine.async_engine import KvEventBatch
from maas_services.engine.core.protocol import ADAPTER_LOADED, ADAPTER_UNLOADED
from maas_services.engine.servicer import kv_batch_proto

KIND = engine_pb2.KvEvent.Kind


def test_block_and_adapter_events_keep_their_order_and_fields():
    batch = KvEventBatch(
        7,
        [
            ("cleared", []),
            ("stored", [1, 2]),
            (ADAPTER_UNLOADED, "old"),
            (ADAPTER_LOADED, "new"),
            ("evicted", [2]),
        ],
    )
    proto = kv_batch_proto("e1", batch)
    assert (proto.sequence, proto.engine_id) == (7, "e1")
    got = [(e.kind, list(e.block_hashes), e.adapter) for e in proto.events]
    assert got == [
        (KIND.KIND_CLEARED, [], ""),
        (KIND.KIND_STORED, [1, 2], ""),
        (KIND.KIND_ADAPTER_UNLOADED, [], "old"),
        (KIND.KIND_ADAPTER_LOADED, [], "new"),
        (KIND.KIND_EVICTED, [2], ""),
    ]
