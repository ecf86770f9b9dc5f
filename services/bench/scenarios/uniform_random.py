"""Uniform random prompts with no shared prefix: routing can only balance load.

Every prompt starts with its own random system message, so not even the chat
template's first block is shared, and prefix affinity has nothing to exploit.
A closed loop of `concurrency` clients sends the requests. Compared:
prefix_affinity against least_load, which it should match within 5%.
"""

import argparse
import asyncio
import random
from dataclasses import asdict, dataclass

from services.bench.scenario import Send
from services.bench.text import words

SYSTEM_TOKENS = 16
TOLERANCE = 0.05


@dataclass
class UniformRandom:
    name = "uniform-random"
    default_policies = ("prefix_affinity", "least_load")

    requests: int = 64
    prompt_tokens: int = 256
    concurrency: int = 16
    max_tokens: int = 16
    seed: int = 0

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("uniform-random")
        group.add_argument("--requests", type=int, default=cls.requests)
        group.add_argument("--prompt-tokens", type=int, default=cls.prompt_tokens)
        group.add_argument(
            "--concurrency", type=int, default=cls.concurrency, help="clients in a closed loop"
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "UniformRandom":
        return cls(
            requests=args.requests,
            prompt_tokens=args.prompt_tokens,
            concurrency=args.concurrency,
            max_tokens=args.max_tokens,
            seed=args.seed,
        )

    def describe(self) -> dict:
        return asdict(self)

    def total_requests(self) -> int:
        return self.requests

    def largest_request_tokens(self) -> int:
        return SYSTEM_TOKENS + self.prompt_tokens + self.max_tokens + 16

    def working_set_tokens(self) -> int:
        return self.requests * self.largest_request_tokens()

    def messages(self, index: int) -> list[dict]:
        rng = random.Random(f"{self.seed}/request/{index}")
        return [
            {"role": "system", "content": words(rng, SYSTEM_TOKENS)},
            {"role": "user", "content": words(rng, self.prompt_tokens)},
        ]

    async def prepare(self, send: Send) -> None:
        """Nothing to set up: no prompt is ever sent twice."""

    async def run(self, send: Send) -> None:
        pending = iter(range(self.requests))

        async def client() -> None:
            for index in pending:  # shared iterator: each request is sent once
                await send(self.messages(index), "")

        await asyncio.gather(*(client() for _ in range(self.concurrency)))

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
