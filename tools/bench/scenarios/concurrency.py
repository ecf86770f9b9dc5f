"""Closed loop: `concurrency` clients, each sending its next request when its last ends.

The server sets the pace, so this finds the throughput and latency at a
given number of requests in flight (sweep --concurrency for the curve). Same
prompts and loop as uniform-random, measured on one stack instead of
comparing routing policies.
"""

from dataclasses import dataclass

from maas_tools.bench.scenario import SingleStack
from maas_tools.bench.scenarios.uniform_random import UniformRandom


@dataclass
class Concurrency(SingleStack, UniformRandom):
    name = "concurrency"

    concurrency: int = 8
