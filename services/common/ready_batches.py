"""An async stream's items in lists of whatever is ready: coalescing that never waits.

A token stream costs its writer per message (a gRPC message, an SSE chunk
through every ASGI middleware), not per token, so a writer that is behind
should send everything that piled up in one message. `ready_batches` reads
the source in a task of its own while the consumer writes: a consumer that
keeps up gets each item alone the moment it arrives (no window, no added
latency), one that is slowed by its own reader (flow control) or by a busy
event loop gets, on its next turn, everything that arrived meanwhile.

What is read ahead is bounded (`limit` items): past it the reading task
waits, and the source's own flow control (gRPC's window, the engine's queue)
holds the rest, as it did before the read-ahead. 64 tokens in one write
already make the write's cost per token small. Reading starts with the first
batch asked for. The engine's servicers batch their outputs so.

A source that can say whether its next item is already here needs no
reading task: `told_batches` (the gateway's fronts, whose engine calls
buffer what the engine sent). A front reports what it has written
(Run.delivered), so a slow client that leaves is billed the tokens it was
sent, not those of a batch whose write failed.

The source is only read in the task; closing the batches (or cancelling their
consumer) cancels that task, which closes the source there, exactly as a
cancel of the consumer reading the source itself did: an engine stream's
cleanup (the call's cancel, its tally) runs the same way.
"""

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TypeVar

T = TypeVar("T")


async def ready_batches(source: AsyncGenerator[T], limit: int = 64) -> AsyncIterator[list[T]]:
    """Lists of the items `source` produced since the last list was taken, never empty."""
    loop = asyncio.get_running_loop()
    ready: list[T] = []
    ended = False
    # Whichever side waits (the consumer for items, the reader for room) parks
    # on a future of its own that the other side resolves: no more per item.
    for_items: asyncio.Future | None = None
    for_room: asyncio.Future | None = None

    def wake(waiter: asyncio.Future | None) -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read() -> None:
        nonlocal ended, for_room
        try:
            async for item in source:
                ready.append(item)
                wake(for_items)
                if len(ready) >= limit:
                    for_room = loop.create_future()
                    await for_room
        finally:
            try:
                # Cancelled while waiting for room, the source sits at a yield: close it here.
                await source.aclose()
            finally:
                ended = True
                wake(for_items)

    reader = asyncio.ensure_future(read())
    try:
        while True:
            if not ready and not ended:
                for_items = loop.create_future()
                await for_items
            if ready:
                batch, ready = ready, []
                wake(for_room)
                yield batch
            elif ended:
                # The source's end, or its error, reaches the consumer here.
                await reader
                return
    finally:
        reader.cancel()
        # The source's cleanup finishes before the consumer's own goes on.
        await asyncio.wait([reader])
        if not reader.cancelled():
            # Seen: an error of a source the consumer stopped reading is not news.
            reader.exception()


async def told_batches(
    first: T, rest: AsyncIterator[T], ready: Callable[[], bool], limit: int = 64
) -> AsyncIterator[list[T]]:
    """`first` (an item already read from `rest`), then `rest`, in lists of what
    was ready, without a reading task: a source that can tell (`ready()`: its
    next item is here, a gateway's GenerateMany call knows) is read on the
    consumer's own turn for every item it has, and awaited only when it has
    none. A task's handoff per item is what this saves; a source that cannot
    tell (ready() always False) gives lists of one. Closing this leaves `rest`
    to its owner: a front's deltas are closed by their Run."""
    batch = [first]
    while True:
        while len(batch) < limit and ready():
            try:
                batch.append(await anext(rest))
            except StopAsyncIteration:
                yield batch
                return
        yield batch
        try:
            batch = [await anext(rest)]
        except StopAsyncIteration:
            return


async def prepend(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    """`first` (an item already read from `rest`), then the rest of `rest`. Closing
    this leaves `rest` to its owner: a front's deltas are closed by their Run."""
    yield first
    async for item in rest:
        yield item
