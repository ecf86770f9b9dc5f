import asyncio
import random
import statistics
import time

import pytest

from maas_tools.bench import arrivals
from maas_tools.bench.client import RequestResult
from maas_tools.bench.loops import closed_loop, open_loop
from maas_tools.bench.scenarios.concurrency import Concurrency
from maas_tools.bench.scenarios.rate import Rate


def test_poisson_gaps_average_one_over_the_rate_and_repeat_with_the_seed():
    offsets = arrivals.poisson(4.0, 4000, random.Random("s"))
    gaps = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    assert offsets[0] == 0.0
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.05)
    # Exponential: the standard deviation equals the mean (a fixed interval would have 0).
    assert statistics.stdev(gaps) == pytest.approx(0.25, rel=0.1)
    assert offsets == arrivals.poisson(4.0, 4000, random.Random("s"))
    assert offsets != arrivals.poisson(4.0, 4000, random.Random("other"))


def test_periodic_stays_before_the_end():
    assert arrivals.periodic(2.0, until=7.0) == [2.0, 4.0, 6.0]
    assert arrivals.periodic(2.0, until=1.0) == []


class InFlight:
    """A fake send that records how many calls overlap."""

    def __init__(self, seconds: float):
        self.seconds, self.now, self.peak, self.calls = seconds, 0, 0, 0

    async def __call__(self, messages, session="", *, max_tokens=0, kind=""):
        self.now += 1
        self.calls += 1
        self.peak = max(self.peak, self.now)
        await asyncio.sleep(self.seconds)
        self.now -= 1
        return RequestResult()


async def test_concurrency_never_has_more_than_n_in_flight_and_sends_each_once():
    send = InFlight(0.002)
    await Concurrency(requests=30, concurrency=4).run(send)
    assert send.calls == 30
    assert send.peak == 4


async def test_rate_sends_on_schedule_without_waiting_for_replies():
    send = InFlight(0.1)  # far slower than the 1000 req/s arrivals
    started = time.perf_counter()
    await Rate(requests=20, request_rate=1000.0).run(send)
    assert send.calls == 20
    assert send.peak > 10  # a closed loop of one would have peaked at 1
    assert time.perf_counter() - started < 1.0


async def test_open_loop_starts_each_at_its_offset():
    loop = asyncio.get_running_loop()
    start = loop.time()
    started = {}

    async def fire(index):
        started[index] = loop.time() - start

    await open_loop([0.0, 0.03, 0.06], fire)
    # Timers may fire a clock tick early; never a schedule step early.
    assert started[0] < started[1] < started[2]
    assert started[1] >= 0.029 and started[2] >= 0.059


async def test_closed_loop_fires_every_item_once():
    seen = []

    async def fire(item):
        seen.append(item)
        await asyncio.sleep(0)

    await closed_loop("abcdef", 3, fire)
    assert sorted(seen) == list("abcdef")
