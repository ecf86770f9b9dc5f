"""The vLLM servicer takes what its reader queued, at most READY_LIMIT items a message."""

import asyncio

from maas_services.engine.vllm_backend.servicer import READY_LIMIT, ready_items


async def test_a_pile_is_taken_in_bounded_lists_in_order():
    queue: asyncio.Queue = asyncio.Queue()
    many = 3 * READY_LIMIT + 5
    for item in range(many):
        queue.put_nowait(item)
    taken = [await ready_items(queue) for _ in range(4)]
    assert [len(items) for items in taken] == [READY_LIMIT] * 3 + [5]
    assert [item for items in taken for item in items] == list(range(many))


async def test_with_nothing_queued_it_waits_for_the_next_item():
    queue: asyncio.Queue = asyncio.Queue()
    waiting = asyncio.ensure_future(ready_items(queue))
    await asyncio.sleep(0)
    assert not waiting.done()
    queue.put_nowait("chunk")
    assert await waiting == ["chunk"]
