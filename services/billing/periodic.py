"""A billing chore run every interval, forever: the stream trimmer and the upkeep.

A failing round (Redis or the database down, a bug) is retried with the
consumer's capped, jittered backoff and reported by the chore's own
`failed` (its counter and log line); no failure ends the loop, and a fresh
retrier per round restarts the backoff from its minimum after a success.
"""

import asyncio
from collections.abc import Awaitable, Callable

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from maas_services.billing.consumer import BACKOFF
from maas_services.common.redis_client import honour_swallowed_cancel


async def every(
    interval: float,
    chore: Callable[[], Awaitable[object]],
    failed: Callable[[RetryCallState], None],
) -> None:
    while True:
        async for attempt in AsyncRetrying(
            wait=BACKOFF,
            retry=retry_if_exception_type(Exception),
            before_sleep=failed,
            reraise=True,
        ):
            with attempt:
                honour_swallowed_cancel()
                await chore()
        await asyncio.sleep(interval)
