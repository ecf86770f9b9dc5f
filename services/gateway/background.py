"""Work a request owes after its response: it must finish even if the request is cancelled."""

import asyncio


class Background:
    def __init__(self):
        self._tasks: set[asyncio.Task] = set()

    def run(self, coro) -> asyncio.Task:
        """Run `coro` to completion even if the request that started it is cancelled."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def wait(self) -> None:
        # Until none is left: an abandoned request's task starts its billing's.
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
