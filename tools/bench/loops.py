"""The two ways a load generator drives requests, shared by every scenario.

Open loop: requests start on a schedule whatever the server does, as
independent users arrive; a slow server builds a queue, which is what a
rate test must show. Closed loop: N clients each send their next request when
the last one finished, so at most N are in flight and the server sets the pace.
"""

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


async def open_loop(offsets: list[float], fire: Callable[[int], Awaitable]) -> None:
    """Starts fire(i) offsets[i] seconds after the call; never waits for one to finish."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = []
    for index, offset in enumerate(offsets):
        delay = start + offset - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(fire(index)))
    await asyncio.gather(*tasks)


async def closed_loop(items: Iterable[T], clients: int, fire: Callable[[T], Awaitable]) -> None:
    """`clients` workers share one iterator: each item fired once, `clients` at most at a time."""
    pending = iter(items)

    async def client() -> None:
        for item in pending:
            await fire(item)

    await asyncio.gather(*(client() for _ in range(clients)))
