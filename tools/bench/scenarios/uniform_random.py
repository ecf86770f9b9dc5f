"""Uniform random prompts with no shared prefix: routing can only balance load.

A closed loop of `concurrency` clients sends the requests (unique_prompts.py
builds them). Compared: prefix_affinity against least_load, which it should
match within 5%.
"""

from dataclasses import dataclass
from functools import partial

from maas_tools.bench.loops import closed_loop
from maas_tools.bench.scenario import Send
from maas_tools.bench.scenarios.unique_prompts import UniquePrompts

TOLERANCE = 0.05


@dataclass
class UniformRandom(UniquePrompts):
    name = "uniform-random"
    default_policies = ("prefix_affinity", "least_load")
    # A third of the working set: policies differ only once caches must choose.
    kv_cache_fraction = 1 / 3

    concurrency: int = 16

    async def run(self, send: Send) -> None:
        await closed_loop(range(self.requests), self.concurrency, partial(self.send_one, send))

    def verdict(self, runs: dict[str, dict]) -> dict:
        affinity, baseline = runs.get("prefix_affinity"), runs.get("least_load")
        if not affinity or not baseline:
            return {}
        throughput = _ratio(
            affinity["throughput"]["output_tokens_per_s"],
            baseline["throughput"]["output_tokens_per_s"],
        )
        ttft = _ratio(affinity["ttft_s"].get("mean"), baseline["ttft_s"].get("mean"))
        # "Within 5%" in the direction that matters: not slower, not less throughput.
        return {
            "output_throughput_ratio": {
                "value": throughput,
                "target": f">= {1 - TOLERANCE}",
                "met": throughput >= 1 - TOLERANCE,
            },
            "ttft_mean_ratio": {
                "value": ttft,
                "target": f"<= {1 + TOLERANCE}",
                "met": 0 < ttft <= 1 + TOLERANCE,
            },
        }


def _ratio(value: float | None, reference: float | None) -> float:
    return round(value / reference, 3) if value and reference else 0.0
