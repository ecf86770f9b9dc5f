"""The first pick is sent once the prompt is tokenized, beside the reserve trip and
the fair queue (engine_client.EarlyPick): used when admission succeeds, never
sent on to an engine when it fails, picked again after a wait past the router's
load report period, and cancelled with a request whose client left."""

import asyncio
import uuid

import pytest

from maas_services.common.openai_api.errors import APIError
from maas_services.gateway import pipeline as pipeline_module
from maas_services.gateway.admission.tenants import Tenant
from maas_services.gateway.upstream import engine_client
from tests.integration.gateway.conftest import MODEL
from tests.integration.gateway.task_count import tasks_created

ONE_SLOT = f"deployments:\n  {MODEL}: {{max_in_flight: 1}}\n"
HANG_GUARD_SECONDS = 30


def tenant(**limits) -> Tenant:
    return Tenant(name=f"pick-{uuid.uuid4().hex[:8]}", **limits)


def reserve_after_the_pick(monkeypatch, router) -> None:
    """The reserve trip is answered only once the router has the early pick."""
    replies = pipeline_module.replies

    async def after_the_pick(*calls):
        await picked(router, 1)
        return await replies(*calls)

    monkeypatch.setattr(pipeline_module, "replies", after_the_pick)


def assert_no_task_left(created: list[asyncio.Task]) -> None:
    """Every task the gateway made has ended, its pick's among them. The stub
    servers run in the test's loop: their tasks (grpc's Cython server) may
    still be finishing a cancelled call."""
    picks = [t for t in created if t.get_coro().__qualname__ == "EngineClient._early_pick"]
    assert len(picks) == 1 and picks[0].done()
    left = [t for t in created if not t.done()]
    assert all("grpc/_cython" in t.get_coro().cr_code.co_filename for t in left), left


async def picked(router, count: int) -> None:
    async with asyncio.timeout(HANG_GUARD_SECONDS):
        while len(router.picks) < count:
            await asyncio.sleep(0.005)


async def holding_the_slot(cluster):
    """A stream stalled after its first token, holding the deployment's one slot."""
    for engine in cluster.engines:
        engine.stall_after = 1
    run = await cluster.complete()
    deltas = run.deltas
    await anext(deltas)
    return run


async def test_an_admitted_request_streams_from_its_early_pick(make_cluster):
    cluster = await make_cluster(replicas=2)
    deltas = await cluster.run(tenant(tpm=10_000))
    assert "".join(d.text for d in deltas) == "Hello there friend"
    # One pick, the one sent during admission, and its endpoint served the request.
    assert cluster.router.picks == ["e0"]
    assert [e.served for e in cluster.engines] == [1, 0]


async def test_a_request_refused_at_reserve_with_its_pick_sent_reaches_no_engine(
    make_cluster, monkeypatch
):
    cluster = await make_cluster(replicas=2)
    reserve_after_the_pick(monkeypatch, cluster.router)
    # Its floor (8 tokens) passes the limits; its need (3 + 8) is over the TPM.
    with pytest.raises(APIError) as refused:
        await cluster.run(tenant(tpm=10), max_tokens=8)
    assert refused.value.status == 429
    await cluster.pipeline.background.wait()
    assert cluster.router.picks == ["e0"]
    assert [e.served for e in cluster.engines] == [0, 0]
    assert cluster.router.releases == []  # nothing told: the router would ignore it


async def test_a_request_refused_by_the_queue_with_its_pick_sent_reaches_no_engine(make_cluster):
    cluster = await make_cluster(replicas=2, routes=ONE_SLOT, queue_timeout_seconds=0.3)
    holder = await holding_the_slot(cluster)
    # Nobody waits: it picks early, then waits for the slot until the queue's timeout.
    with pytest.raises(APIError) as refused:
        await cluster.run(tenant())
    assert refused.value.status == 503
    assert cluster.router.picks == ["e0", "e1"]
    assert [e.served for e in cluster.engines] == [1, 0]
    await holder.close()


async def test_a_request_that_waited_past_the_report_period_picks_again(make_cluster):
    cluster = await make_cluster(replicas=2, routes=ONE_SLOT, queue_timeout_seconds=3600)
    holder = await holding_the_slot(cluster)
    waiting = asyncio.ensure_future(cluster.run(tenant()))
    await picked(cluster.router, 2)
    # Its early pick (e1) is older than the router's load report period when it gets the slot.
    await asyncio.sleep(engine_client.EARLY_PICK_SECONDS + 0.1)
    await holder.close()
    for engine in cluster.engines:
        engine.stall_after = None
    deltas = await asyncio.wait_for(waiting, HANG_GUARD_SECONDS)
    assert deltas[-1].finish_reason == "stop"
    assert cluster.router.picks == ["e0", "e1", "e0"]
    assert [e.served for e in cluster.engines] == [2, 0]


async def test_a_request_admitted_within_the_report_period_keeps_its_early_pick(
    make_cluster, monkeypatch
):
    # However slow the machine, the wait stays within the period.
    monkeypatch.setattr(engine_client, "EARLY_PICK_SECONDS", 3600.0)
    cluster = await make_cluster(replicas=2, routes=ONE_SLOT, queue_timeout_seconds=3600)
    holder = await holding_the_slot(cluster)
    waiting = asyncio.ensure_future(cluster.run(tenant()))
    await picked(cluster.router, 2)
    await holder.close()
    for engine in cluster.engines:
        engine.stall_after = None
    await asyncio.wait_for(waiting, HANG_GUARD_SECONDS)
    assert cluster.router.picks == ["e0", "e1"]
    assert [e.served for e in cluster.engines] == [1, 1]


async def test_a_flood_refused_by_a_full_queue_leaves_no_pick_counted(make_cluster):
    """The worst case for the router's counts: a burst that a full queue refuses.
    Only the request that found nobody waiting picked; the rest picked nothing."""
    cluster = await make_cluster(
        replicas=2, routes=ONE_SLOT, queue_size=1, queue_timeout_seconds=3600
    )
    holder = await holding_the_slot(cluster)
    flooder = tenant()
    first = asyncio.ensure_future(cluster.run(flooder))
    queue = cluster.pipeline.queues._queues[MODEL]  # the flood must find it waiting
    async with asyncio.timeout(HANG_GUARD_SECONDS):
        while not queue.waiting:
            await asyncio.sleep(0.005)
    flood = await asyncio.gather(*(cluster.run(flooder) for _ in range(50)), return_exceptions=True)
    assert all(isinstance(r, APIError) and r.status in (429, 503) for r in flood)
    assert cluster.router.picks == ["e0", "e1"]
    await holder.close()
    for engine in cluster.engines:
        engine.stall_after = None
    await asyncio.wait_for(first, HANG_GUARD_SECONDS)


async def test_a_client_gone_during_admission_cancels_its_pick(make_cluster, monkeypatch):
    cluster = await make_cluster(replicas=2)
    await cluster.run(tenant())  # connected, methods resolved
    entered = asyncio.Event()

    async def never_answered(*calls):
        entered.set()
        await asyncio.Event().wait()

    # Gone while its reserve trip runs: its pick was sent just before, still in flight.
    monkeypatch.setattr(pipeline_module, "replies", never_answered)
    with tasks_created() as created:
        request = asyncio.ensure_future(cluster.complete(tenant(tpm=10_000)))
        async with asyncio.timeout(HANG_GUARD_SECONDS):
            await entered.wait()
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)
        await cluster.pipeline.background.wait()
        for _ in range(5):  # what the cancellations schedule runs too
            await asyncio.sleep(0)
    assert_no_task_left(created)
    assert [e.served for e in cluster.engines] == [1, 0]


async def test_a_run_closed_unread_cancels_its_pick(make_cluster):
    """Admitted, then its client gone before the deltas were read: no task left."""
    cluster = await make_cluster(replicas=2)
    with tasks_created() as created:
        run = await cluster.complete(tenant())
        await run.close()
        await cluster.pipeline.background.wait()
        for _ in range(5):
            await asyncio.sleep(0)
    assert_no_task_left(created)
    assert [e.served for e in cluster.engines] == [0, 0]
