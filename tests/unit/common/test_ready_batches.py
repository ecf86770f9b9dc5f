"""ready_batches: a consumer that keeps up gets each item alone, one that is behind
gets what piled up; the source's end, error and cleanup reach the consumer."""

import asyncio
from contextlib import aclosing

import pytest

from maas_services.common.ready_batches import ready_batches, told_batches


async def paced(items, gate: asyncio.Event | None = None, closed: list | None = None):
    """Yields each item once `gate` is set (then at once), recording its cleanup."""
    try:
        for item in items:
            if gate is not None:
                await gate.wait()
            yield item
            await asyncio.sleep(0)
    finally:
        if closed is not None:
            closed.append(True)


async def test_a_consumer_that_keeps_up_gets_each_item_alone():
    gates = [asyncio.Event() for _ in range(4)]

    async def one_at_a_time():
        for index, gate in enumerate(gates):
            await gate.wait()
            yield index

    batches = []
    async with aclosing(ready_batches(one_at_a_time())) as stream:
        gates[0].set()
        async for batch in stream:
            batches.append(batch)
            if len(batches) < len(gates):
                gates[len(batches)].set()
    assert batches == [[0], [1], [2], [3]]


async def test_a_consumer_that_is_behind_gets_everything_that_piled_up_at_once():
    source_done = asyncio.Event()

    async def burst():
        for item in range(10):
            yield item
            await asyncio.sleep(0)
        source_done.set()

    batches = []
    async with aclosing(ready_batches(burst())) as stream:
        async for batch in stream:
            batches.append(batch)
            # A write that does not return until the source has produced everything.
            await source_done.wait()
    assert [item for batch in batches for item in batch] == list(range(10))
    assert len(batches) == 2
    assert batches[1] == list(range(1, 10))


async def test_read_ahead_stops_at_the_limit_until_the_consumer_takes():
    produced = []

    async def endless():
        item = 0
        while True:
            produced.append(item)
            yield item
            item += 1

    async with aclosing(ready_batches(endless(), limit=5)) as stream:
        first = await anext(stream)
        for _ in range(20):
            await asyncio.sleep(0)
        # At most one batch taken plus `limit` waiting (and the one in hand).
        assert len(produced) <= len(first) + 5 + 1
        second = await anext(stream)
    assert first + second == list(range(len(first) + len(second)))


async def test_an_error_reaches_the_consumer_after_the_items_before_it():
    async def failing():
        yield 1
        yield 2
        raise ValueError("engine broke")

    seen = []
    with pytest.raises(ValueError, match="engine broke"):
        async with aclosing(ready_batches(failing())) as stream:
            async for batch in stream:
                seen += batch
    assert seen == [1, 2]


async def test_closing_the_batches_closes_the_source_before_returning():
    closed: list[bool] = []
    never = asyncio.Event()
    stream = ready_batches(paced([1, 2, 3], gate=never, closed=closed))
    reading = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.01)
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    assert closed == [True]


async def test_a_source_waiting_for_room_is_closed_too():
    closed: list[bool] = []
    async with aclosing(ready_batches(paced(range(100), closed=closed), limit=2)) as stream:
        await anext(stream)
        for _ in range(10):
            await asyncio.sleep(0)
    assert closed == [True]


async def test_told_batches_take_what_the_source_says_is_here_without_a_task():
    """A source that tells what it holds: the first item alone, then what
    arrived while the consumer was away, then its end; no task is started."""
    held: list[int] = []
    arrived = asyncio.Event()

    async def source():
        while True:
            while not held:
                arrived.clear()
                await arrived.wait()
            item = held.pop(0)
            if item < 0:
                return
            yield item

    rest = source()
    tasks_before = len(asyncio.all_tasks())
    batches = told_batches(0, rest, lambda: bool(held))
    assert await anext(batches) == [0]
    held.extend([1, 2, 3])
    arrived.set()
    assert await anext(batches) == [1, 2, 3]
    assert len(asyncio.all_tasks()) == tasks_before
    held.extend([4, -1])
    arrived.set()
    assert await anext(batches) == [4]
    with pytest.raises(StopAsyncIteration):
        await anext(batches)


async def test_told_batches_stop_at_the_limit_and_leave_the_source_open():
    closed: list[bool] = []
    rest = paced(range(1, 10), closed=closed)
    async with aclosing(told_batches(0, rest, lambda: True, limit=4)) as stream:
        assert await anext(stream) == [0, 1, 2, 3]
        assert await anext(stream) == [4, 5, 6, 7]
    # The source is its owner's to close (a front's deltas: their Run).
    assert not closed
    await rest.aclose()
    assert closed
