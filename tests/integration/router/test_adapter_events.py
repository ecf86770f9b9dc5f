"""An engine's adapter loads and unloads reach the router on its KV event stream,
ahead of any load report: a load makes the replica the adapter's pick at once, an
unload ends that, and a reconnecting router learns the adapters from the snapshot.
No load report comes during a test (a minute between polls): only events can tell."""

from tests.integration.router.conftest import eventually
from tests.integration.router.test_adapter_affinity import engines, known, pick


async def live(router) -> None:
    await eventually(
        lambda: all(e.kv_events_live for e in router.pool.endpoints.values()), what="events"
    )


async def test_a_load_and_an_unload_change_the_pick_before_any_load_report(cluster):
    await engines(cluster, a=(2, []), b=(2, []))
    router = await cluster.router(poll_interval_seconds=60)
    await known(router, 2)
    await live(router)
    b = router.pool.endpoints["b"]
    cluster.engines[1].load_adapter("sql")
    await eventually(lambda: "sql" in b.adapters, what="the load's event")
    # Without the event the two would tie (room on both); the holder wins every pick.
    assert {await pick(router, "sql", tokens=[i, i + 1]) for i in range(4)} == {"b"}
    cluster.engines[1].unload_adapter("sql")
    await eventually(lambda: "sql" not in b.adapters, what="the unload's event")


async def test_a_restarted_engine_s_snapshot_replaces_the_adapters_it_had(cluster):
    await engines(cluster, a=(2, ["chat", "sql"]))
    router = await cluster.router(poll_interval_seconds=60)
    await known(router, 1)
    await live(router)
    a = router.pool.endpoints["a"]
    assert a.adapters == {"chat", "sql"}
    engine = cluster.engines[0]
    await engine.stop()
    engine.load.adapters[:] = ["math"]  # what it holds after its restart (--lora-modules)
    await engine.start()  # the same port: the router's stream reconnects
    await eventually(lambda: a.adapters == {"math"}, what="the new stream's snapshot")
