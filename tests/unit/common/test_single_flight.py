"""SingleFlight: callers of one key share one task; one leaving cancels nothing; the
key is free again once the task ends, whatever its end."""

import asyncio

import pytest

from maas_services.common.single_flight import SingleFlight


async def test_callers_share_one_task_and_one_leaving_cancels_nothing():
    flight: SingleFlight[int] = SingleFlight()
    started, release = [], asyncio.Event()

    async def work() -> int:
        started.append(1)
        await release.wait()
        return 42

    waiters = [asyncio.ensure_future(flight.run("k", work)) for _ in range(5)]
    await asyncio.sleep(0)
    waiters[0].cancel()
    release.set()
    assert await asyncio.gather(*waiters[1:]) == [42] * 4
    assert started == [1]
    # Ended: the next caller starts afresh.
    assert await flight.run("k", work) == 42
    assert started == [1, 1]


async def test_an_error_reaches_its_callers_and_frees_the_key():
    flight: SingleFlight[int] = SingleFlight()

    async def failing() -> int:
        raise ValueError("no")

    with pytest.raises(ValueError):
        await flight.run("k", failing)

    async def fine() -> int:
        return 1

    assert await flight.run("k", fine) == 1
