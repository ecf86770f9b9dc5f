"""Counting the tasks a piece of the gateway makes: each costs the loop a schedule and a step."""

import asyncio
import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def tasks_created() -> Iterator[list[asyncio.Task]]:
    """The tasks the running loop creates while the block runs, in order."""
    loop = asyncio.get_running_loop()
    created: list[asyncio.Task] = []

    def factory(loop, coro, **kwargs):
        task = asyncio.Task(coro, loop=loop, **kwargs)
        created.append(task)
        return task

    loop.set_task_factory(factory)
    try:
        yield created
    finally:
        loop.set_task_factory(None)
