import asyncio
import random
import statistics
import time

import pytest

from maas_services.gateway.admission.fair_queue import FairQueue, QueueFullError, QueueTimeoutError


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


async def closed_loop(queue, tenant, streams, until, rng, latencies):
    """`streams` clients that each send a request as soon as their last ends."""

    async def client():
        while time.perf_counter() < until:
            arrived = time.perf_counter()
            await queue.acquire(tenant, weight=1.0)
            try:
                await asyncio.sleep(rng.uniform(0.02, 0.06))
            finally:
                queue.release()
            latencies.append(time.perf_counter() - arrived)

    await asyncio.gather(*(client() for _ in range(streams)))


async def b_latencies(flood: bool) -> tuple[list[float], list[float]]:
    queue = FairQueue("fair", slots=16, max_waiting=1000, timeout=30)
    rng = random.Random(7)
    until = time.perf_counter() + 1.2
    a, b = [], []
    runs = [closed_loop(queue, "b", 2, until, rng, b)]
    if flood:
        runs.append(closed_loop(queue, "a", 50, until, rng, a))
    await asyncio.gather(*runs)
    return a, b


async def test_a_small_tenant_is_not_starved_by_a_flood():
    # Time in the system (queue wait + service): alone, tenant B's 2 streams
    # never wait, so its latency is its service time; under tenant A's 50
    # streams it may wait for a slot to free, but must not queue behind A.
    _, alone = await b_latencies(flood=False)
    a, flooded = await b_latencies(flood=True)
    assert p95(flooded) <= 2 * p95(alone), (p95(flooded), p95(alone))
    # The flood really saturated the slots: A's requests waited a lot.
    assert statistics.median(a) > 2 * statistics.median(alone)


async def test_backlogged_tenants_share_by_weight():
    queue = FairQueue("weights", slots=1, max_waiting=100, timeout=30)
    await queue.acquire("holder", 1.0)
    order = []

    async def one(tenant, weight):
        await queue.acquire(tenant, weight)
        order.append(tenant)
        queue.release()

    waiters = [one("light", 1.0) for _ in range(40)] + [one("heavy", 3.0) for _ in range(40)]
    tasks = [asyncio.create_task(w) for w in waiters]
    await asyncio.sleep(0)
    queue.release()
    await asyncio.gather(*tasks)
    first = order[:40]
    assert first.count("heavy") == 30 and first.count("light") == 10


async def test_a_full_queue_refuses_at_once():
    queue = FairQueue("full", slots=1, max_waiting=2, timeout=30)
    await queue.acquire("t", 1.0)
    waiting = [asyncio.create_task(queue.acquire("t", 1.0)) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(QueueFullError):
        await queue.acquire("t", 1.0)
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert queue.waiting == 0


async def test_waiting_longer_than_the_timeout_fails_and_frees_the_place():
    queue = FairQueue("slow", slots=1, max_waiting=1, timeout=0.05)
    await queue.acquire("t", 1.0)
    with pytest.raises(QueueTimeoutError):
        await queue.acquire("t", 1.0)
    assert queue.waiting == 0
    queue.release()
    assert await queue.acquire("t", 1.0) == 0.0


async def test_cancelled_waiters_do_not_take_slots_and_new_slots_are_handed_out():
    queue = FairQueue("grow", slots=1, max_waiting=10, timeout=30)
    await queue.acquire("t", 1.0)
    gone = asyncio.create_task(queue.acquire("t", 1.0))
    staying = [asyncio.create_task(queue.acquire("u", 1.0)) for _ in range(2)]
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    queue.resize(3)
    await asyncio.gather(*staying)
    assert queue.in_use == 3 and queue.waiting == 0


async def test_a_request_weighs_its_sequences_in_slots_and_in_the_fair_share():
    queue = FairQueue("wide", slots=4, max_waiting=100, timeout=30)
    await queue.acquire("holder", 1.0, cost=4)
    order = []

    async def one(tenant, cost):
        await queue.acquire(tenant, 1.0, cost)
        order.append(tenant)
        queue.release(cost)

    # Equal weights: n=4 requests get a quarter of the requests through that
    # n=1 requests do, so both tenants get the same number of sequences.
    waiters = [one("wide", 4) for _ in range(10)] + [one("narrow", 1) for _ in range(40)]
    tasks = [asyncio.create_task(w) for w in waiters]
    await asyncio.sleep(0)
    assert queue.waiting == 50
    queue.release(4)
    await asyncio.gather(*tasks)
    assert order[:25].count("wide") == 5
    assert queue.in_use == 0


async def test_a_wide_request_at_the_head_is_not_overtaken_and_one_wider_than_all_runs_alone():
    queue = FairQueue("head", slots=4, max_waiting=10, timeout=30)
    await queue.acquire("t", 1.0, cost=3)
    wider = asyncio.create_task(queue.acquire("u", 1.0, cost=6))
    narrow = asyncio.create_task(queue.acquire("v", 1.0))
    await asyncio.sleep(0)
    # One slot is free, but the head needs more: the narrow request waits behind it.
    assert queue.waiting == 2
    queue.release(3)
    await wider
    assert queue.in_use == 6 and queue.waiting == 1
    queue.release(6)
    await narrow
    assert queue.in_use == 1
