"""Stop work for a client that has gone away.

Streamed responses get this from Starlette, which cancels the stream when
the server reports http.disconnect. A non-streamed response is computed
inside the handler, where nobody listens for that message, so a client that
gave up would keep its engine request (and KV blocks) running to the end;
`unless_disconnected` races the work against the disconnect instead.
"""

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

T = TypeVar("T")


class ClientGoneError(Exception):
    pass


async def _disconnected(receive: Receive) -> None:
    # The body was read already, so the next message is the disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """The result of `work`; raises ClientGoneError (after cancelling `work`)
    if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            # Let its cleanup (closing the engine stream) run before going on.
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientGoneError()
    return task.result()
