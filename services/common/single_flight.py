"""One piece of work per key at a time, shared by everyone who asks for that key meanwhile.

A burst of callers asking for the same thing (a key's lookup, an engine's
stream being opened) waits for one task instead of each starting its own.
The task is shielded: a caller that goes away (a client gone, a timeout)
does not cancel the answer the others wait for. Its key is forgotten when it
ends, so the next caller starts afresh; its error is retrieved then, so one
whose callers all left does not log "exception was never retrieved".
"""

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    def __init__(self):
        self._running: dict[Hashable, asyncio.Future] = {}

    async def run(self, key: Hashable, start: Callable[[], Awaitable[T]]) -> T:
        """The result of the task running for `key`, started by `start()` if none is."""
        task = self._running.get(key)
        if task is None:
            task = self._running[key] = asyncio.ensure_future(start())
            task.add_done_callback(lambda done: self._ended(key, done))
        return await asyncio.shield(task)

    def _ended(self, key: Hashable, task: asyncio.Future) -> None:
        self._running.pop(key, None)
        if not task.cancelled():
            task.exception()
