"""Prompts that share nothing, all one length: uniform-random's, rate's and concurrency's.

Every prompt opens with its own random system message, so not even the chat
template's first block is shared and the prefix cache has nothing to reuse:
what the scenarios built on it measure is routing, batching and arrivals.
Not a scenario itself; they differ in how requests are driven and judged.
"""

import argparse
import random
from dataclasses import dataclass

from maas_tools.bench import workload_args
from maas_tools.bench.scenario import Send
from maas_tools.bench.text import words

SYSTEM_TOKENS = 16


@dataclass
class UniquePrompts(workload_args.RequestsWorkload):
    requests: int = 64
    prompt_tokens: int = 256
    max_tokens: int = 16
    seed: int = 0

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Only the shared traffic flags (workload_args), declared once for all."""

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

    async def send_one(self, send: Send, index: int) -> None:
        await send(self.messages(index))

    async def prepare(self, send: Send) -> None:
        """Nothing to set up: no prompt is ever sent twice."""
