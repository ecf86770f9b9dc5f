"""An engine's adapter loads and unloads, as KV events, change the router's view of
it at once: its adapter set, what the adapter scorer sees, and the events counter.
Only a stream's first batch (the engine's snapshot) replaces the set; a CLEARED
later in a stream leaves it; a load report still replaces it wholesale."""

from maas.v1 import engine_pb2
from maas_services.router.kv_events import KV_EVENTS, apply_batch
from maas_services.router.pick_history import PickHistory
from maas_services.router.prefix_index import PrefixIndex
from maas_services.router.scorers.adapter import AdapterScorer
from tests.unit.router.helpers import context, endpoint

KIND = engine_pb2.KvEvent.Kind


def loaded(name: str) -> engine_pb2.KvEvent:
    return engine_pb2.KvEvent(kind=KIND.KIND_ADAPTER_LOADED, adapter=name)


def unloaded(name: str) -> engine_pb2.KvEvent:
    return engine_pb2.KvEvent(kind=KIND.KIND_ADAPTER_UNLOADED, adapter=name)


CLEARED = engine_pb2.KvEvent(kind=KIND.KIND_CLEARED)


def apply(e, *events, first=False) -> None:
    batch = engine_pb2.KvEventBatch(sequence=1, engine_id=e.endpoint_id, events=events)
    apply_batch(PrefixIndex(), PickHistory(60, 1000), e, batch, first)


def counted(kind: str) -> float:
    return KV_EVENTS.labels(kind)._value.get()


def test_loads_and_unloads_change_the_set_at_once_and_are_counted():
    e = endpoint("e", max_loras=2)
    before = counted("adapter_loaded"), counted("adapter_unloaded")
    apply(e, loaded("sql"), loaded("chat"))
    assert e.adapters == {"sql", "chat"}
    assert AdapterScorer().score(context(adapter="sql"), [e]) == [1.0]
    # An eviction for room: the victim goes, the new one comes, in one batch.
    apply(e, unloaded("chat"), loaded("math"))
    assert e.adapters == {"sql", "math"}
    apply(e, unloaded("never-loaded"))  # harmless
    assert e.adapters == {"sql", "math"}
    after = counted("adapter_loaded"), counted("adapter_unloaded")
    assert (after[0] - before[0], after[1] - before[1]) == (3, 2)


def test_a_snapshot_replaces_the_set_and_a_later_cleared_keeps_it():
    e = endpoint("e", max_loras=4, adapters=frozenset({"gone-with-the-restart", "kept"}))
    apply(e, CLEARED, loaded("kept"), loaded("new"), first=True)
    assert e.adapters == {"kept", "new"}
    # A prefix-cache reset mid-stream: the blocks go, the adapters stay.
    apply(e, CLEARED)
    assert e.adapters == {"kept", "new"}
    # A snapshot of an engine holding none.
    apply(e, CLEARED, first=True)
    assert e.adapters == frozenset()


def test_a_load_report_still_replaces_the_set():
    e = endpoint("e", max_loras=2)
    apply(e, loaded("sql"))
    report = engine_pb2.LoadReport(model="m", max_loras=2, adapters=["chat"])
    e.apply_report(report, counted=0, asked=0.0)
    assert e.adapters == {"chat"}
