"""Open loop: Poisson arrivals at --request-rate, sent whether or not earlier ones ended.

Users don't wait for each other, so past the server's capacity the queue
grows and TTFT climbs without bound; a closed loop would hide that by
slowing down with the server. Gaps are seeded exponential draws; prompts
as uniform-random's (unique_prompts.py).
"""

import random
from dataclasses import dataclass
from functools import partial

from maas_tools.bench import arrivals
from maas_tools.bench.loops import open_loop
from maas_tools.bench.scenario import Send, SingleStack
from maas_tools.bench.scenarios.unique_prompts import UniquePrompts


@dataclass
class Rate(SingleStack, UniquePrompts):
    name = "rate"

    request_rate: float = 2.0

    def arrivals(self) -> list[float]:
        return arrivals.poisson(
            self.request_rate, self.requests, random.Random(f"{self.seed}/arrivals")
        )

    async def run(self, send: Send) -> None:
        await open_loop(self.arrivals(), partial(self.send_one, send))
