"""A tenant cannot hold more than its fair share of a deployment's waiting places.

The queue alone (fair_queue.FairQueue): every request here waits, because one
slot is held by a request that is never released until the test says so.
"""

import asyncio

import pytest
from prometheus_client import REGISTRY

from maas_services.gateway.admission.fair_queue import FairQueue, FairShareError, QueueFullError


def shed(reason: str) -> float:
    return REGISTRY.get_sample_value("maas_gateway_queue_rejected_total", {"reason": reason}) or 0.0


async def busy_queue(name: str, places: int, slots: int = 1) -> FairQueue:
    """A queue whose slots are all taken, so every acquire waits."""
    queue = FairQueue(name, slots=slots, max_waiting=places, timeout=3600)
    await queue.acquire("holder", 1.0, cost=slots)
    return queue


async def waiting(queue: FairQueue, tenant: str, count: int, weight: float = 1.0, cost: int = 1):
    """`count` requests of `tenant`, each waiting in the queue (in this order)."""
    tasks = []
    for _ in range(count):
        tasks.append(asyncio.create_task(queue.acquire(tenant, weight, cost)))
        await asyncio.sleep(0)  # arrived, in order
    return tasks


async def settled() -> None:
    """Let woken tasks run (a displaced waiter's, a granted one's)."""
    for _ in range(5):
        await asyncio.sleep(0)


def refusals(tasks) -> list[BaseException]:
    return [t.exception() for t in tasks if t.done() and t.exception() is not None]


async def drain(queue: FairQueue, tasks) -> list[asyncio.Task]:
    """Release the holder's slot, then each one granted: the tasks in grant order."""
    pending, granted = set(tasks), []
    queue.release()
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task.exception() is None:
                granted.append(task)
                queue.release()
    return granted


async def test_a_flood_cannot_keep_another_tenant_out():
    queue = await busy_queue("flood", places=20)
    flood = await waiting(queue, "flooder", 400)
    # The flooder holds every place; past them it is its own excess.
    assert queue.waiting_for("flooder") == 20
    assert len(refusals(flood)) == 380
    assert all(isinstance(e, FairShareError) for e in refusals(flood))
    displaced_before = shed("displaced")
    victim = await waiting(queue, "victim", 10)
    await settled()
    # Each of the victim's requests took the place of the flooder's newest waiter.
    assert queue.waiting_for("victim") == 10 and queue.waiting_for("flooder") == 10
    assert not refusals(victim)
    assert [t for t in flood if t.done() and t.exception() is None] == []
    displaced = [t for t in flood[:20] if t.done()]
    assert displaced == flood[10:20]
    assert all(isinstance(t.exception(), FairShareError) for t in displaced)
    assert "gave its place" in str(displaced[0].exception())
    assert shed("displaced") - displaced_before == 10
    await drain(queue, victim + flood[:10])
    assert all(t.exception() is None for t in victim)
    assert queue.in_use == 0 and queue.waiting == 0


async def test_a_tenant_at_its_share_is_refused_and_displaces_no_one():
    queue = await busy_queue("at-share", places=4)
    a = await waiting(queue, "a", 4)
    b = await waiting(queue, "b", 2)
    assert (queue.waiting_for("a"), queue.waiting_for("b")) == (2, 2)
    before = shed("over_share")
    # Both now hold their share of 2: a newcomer of either is its tenant's excess.
    with pytest.raises(FairShareError, match="fair share"):
        await queue.acquire("b", 1.0)
    with pytest.raises(FairShareError):
        await queue.acquire("a", 1.0)
    assert shed("over_share") - before == 2
    assert (queue.waiting_for("a"), queue.waiting_for("b")) == (2, 2)
    await drain(queue, a[:2] + b)


async def test_shares_follow_the_weights():
    queue = await busy_queue("weights", places=12)
    light = await waiting(queue, "light", 12, weight=1.0)
    # The heavy tenant's share is 12 * 2 / 3 = 8 places.
    heavy = await waiting(queue, "heavy", 9, weight=2.0)
    assert (queue.waiting_for("heavy"), queue.waiting_for("light")) == (8, 4)
    assert isinstance(heavy[8].exception(), FairShareError)
    # The light tenant holds its share of 4: refused, it displaces no one.
    with pytest.raises(FairShareError):
        await queue.acquire("light", 1.0)
    await drain(queue, light[:4] + heavy[:8])


async def test_most_over_share_tenant_loses_its_newest_first():
    queue = await busy_queue("most-over", places=6)
    # weights 1 and 2: per unit of weight, "a" (4 / 1) is further over than "b" (2 / 2).
    a = await waiting(queue, "a", 4)
    b = await waiting(queue, "b", 2, weight=2.0)
    c = await waiting(queue, "c", 1)
    await settled()
    assert a[3].done() and isinstance(a[3].exception(), FairShareError)
    assert not any(t.done() for t in a[:3] + b + c)
    await drain(queue, a[:3] + b + c)


async def test_less_than_a_whole_place_of_share_is_a_503_not_a_trade():
    # One place, two tenants: a share of half a place each. Taking the place
    # would put the newcomer over its share as much as the holder is: 503.
    queue = await busy_queue("half", places=1)
    (a,) = await waiting(queue, "a", 1)
    with pytest.raises(QueueFullError) as caught:
        await queue.acquire("b", 1.0)
    assert not isinstance(caught.value, FairShareError)
    assert not a.done()
    # Three places, two tenants: b takes one of a's three, then it is stable.
    await drain(queue, [a])
    queue = await busy_queue("odd", places=3)
    a = await waiting(queue, "a", 3)
    (b,) = await waiting(queue, "b", 1)
    await settled()
    assert isinstance(a[2].exception(), FairShareError)
    with pytest.raises(QueueFullError) as caught:
        await queue.acquire("b", 1.0)  # 1 held, share 1.5: no whole place more
    assert not isinstance(caught.value, FairShareError)
    with pytest.raises(FairShareError):
        await queue.acquire("a", 1.0)  # 2 held, share 1.5: a's excess, not b's place
    assert not b.done()
    await drain(queue, a[:2] + [b])


async def test_no_waiting_places_is_a_503():
    queue = await busy_queue("none", places=0)
    with pytest.raises(QueueFullError) as caught:
        await queue.acquire("t", 1.0)
    assert not isinstance(caught.value, FairShareError)


async def test_displacement_keeps_the_fair_order_and_gives_back_the_flooders_tag():
    queue = await busy_queue("order", places=4)
    a = await waiting(queue, "a", 4)  # tags 0..3
    b = await waiting(queue, "b", 2)  # tags 0, 1: a's tags 3 and 2 are displaced
    await settled()
    assert [t.done() for t in a] == [False, False, True, True]
    queue.release()  # the holder ends: a's tag 0 runs
    await settled()
    assert a[0].done() and a[0].exception() is None
    queue.release()  # and ends: b's tag 0 runs
    await settled()
    assert b[0].done() and b[0].exception() is None
    # Room again. a's displaced requests never ran, so its next tag is 2, not 4:
    # level with b's next, and a came first.
    late_a, late_b = await waiting(queue, "a", 1) + await waiting(queue, "b", 1)
    assert await drain(queue, [a[1], b[1], late_a, late_b]) == [a[1], b[1], late_a, late_b]


async def test_a_wide_waiter_takes_one_place_and_no_slot_once_displaced():
    queue = await busy_queue("wide", places=2, slots=4)
    wide = await waiting(queue, "a", 2, cost=4)
    (narrow,) = await waiting(queue, "b", 1)
    await settled()
    assert isinstance(wide[1].exception(), FairShareError)
    assert queue.in_use == 4 and queue.waiting == 2
    queue.release(4)
    await wide[0]
    assert queue.in_use == 4 and not narrow.done()
    queue.release(4)
    await narrow
    queue.release()
    assert queue.in_use == 0 and queue.waiting == 0


async def test_a_displaced_waiter_cancelled_before_it_wakes_gives_back_nothing():
    queue = await busy_queue("race", places=2)
    a = await waiting(queue, "a", 2)
    b = asyncio.create_task(queue.acquire("b", 1.0))
    await asyncio.sleep(0)
    # a's newest was displaced; its client leaves before its task ran again.
    a[1].cancel()
    (outcome,) = await asyncio.gather(a[1], return_exceptions=True)
    # Which one it ends with is asyncio.wait_for's choice; neither gives a slot back.
    assert isinstance(outcome, FairShareError | asyncio.CancelledError)
    assert queue.in_use == 1 and queue.waiting == 2
    await drain(queue, [a[0], b])
    assert queue.in_use == 0 and queue.waiting == 0
