"""Work a request owes after its response: it must finish even if the request is cancelled.

`after` holds a request's own work (release, usage event, TPM settlement)
until its front says the response's last byte is out, so none of it competes
with the bytes the client waits for. It is per request, never batched across
requests: what a kill -9 can lose is one request's bill in the moment after
its last byte, as before. A front that never says (a bug, or a send that
failed) delays the work by DELIVERY_GRACE_SECONDS, never drops it.
"""

import asyncio
import contextlib

DELIVERY_GRACE_SECONDS = 5.0


class Background:
    def __init__(self):
        self._tasks: set[asyncio.Task] = set()

    def run(self, coro) -> asyncio.Task:
        """Run `coro` to completion even if the request that started it is cancelled."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def after(self, delivered: asyncio.Event, coro) -> asyncio.Task:
        """Run `coro` once `delivered` is set (the response is out), in the background."""
        return self.run(_when(delivered, coro))

    async def wait(self) -> None:
        # Until none is left: a request's bill may wait on its engine report's task.
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


async def _when(delivered: asyncio.Event, coro):
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(DELIVERY_GRACE_SECONDS):
            await delivered.wait()
    return await coro
