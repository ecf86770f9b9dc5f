"""Chat traffic: Poisson arrivals, each turn with its own random prompt and answer length.

Lengths are seeded draws from --prompt-len-range and --output-len-range
(lognormal by default: most turns short, a few long; see lengths.py), and
each request asks for exactly its drawn answer length (max_tokens with
ignore_eos). Arrivals are open-loop at --request-rate, as independent users'.
"""

import argparse
import random
from dataclasses import dataclass
from functools import partial

from maas_tools.bench import arrivals, lengths, workload_args
from maas_tools.bench.loops import open_loop
from maas_tools.bench.scenario import Send, SingleStack
from maas_tools.bench.text import words

# Chat-template tokens around a turn (role headers, end markers, the
# template's default system prompt), about: KV sizing needs only a bound.
TEMPLATE_TOKENS = 40


@dataclass
class Chat(SingleStack, workload_args.RequestsWorkload):
    name = "chat"

    requests: int = 40
    request_rate: float = 1.0
    prompt_len_range: tuple[int, int] = (32, 256)
    output_len_range: tuple[int, int] = (8, 64)
    length_dist: str = "lognormal"
    seed: int = 0

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("chat, long-prefill-mix")
        workload_args.add_range_argument(
            group, "--prompt-len-range", cls.prompt_len_range, "chat prompt tokens"
        )
        workload_args.add_range_argument(
            group, "--output-len-range", cls.output_len_range, "chat answer tokens"
        )
        group.add_argument(
            "--length-dist", choices=lengths.DISTRIBUTIONS, help="default: lognormal"
        )

    def chat_request(self, index: int) -> tuple[list[dict], int]:
        """The index-th turn's messages and answer length."""
        rng = random.Random(f"{self.seed}/chat/{index}")
        prompt = lengths.draw(rng, *self.prompt_len_range, self.length_dist)
        answer = lengths.draw(rng, *self.output_len_range, self.length_dist)
        return [{"role": "user", "content": words(rng, prompt)}], answer

    def _chat_sizes(self) -> list[int]:
        return [
            len(messages[0]["content"].split()) + answer + TEMPLATE_TOKENS
            for messages, answer in map(self.chat_request, range(self.requests))
        ]

    def working_set_tokens(self) -> int:
        return sum(self._chat_sizes())

    def largest_request_tokens(self) -> int:
        return max(self._chat_sizes(), default=TEMPLATE_TOKENS)

    def chat_arrivals(self) -> list[float]:
        rng = random.Random(f"{self.seed}/arrivals")
        return arrivals.poisson(self.request_rate, self.requests, rng)

    async def send_chat(self, send: Send, index: int) -> None:
        messages, answer = self.chat_request(index)
        await send(messages, max_tokens=answer, kind="chat")

    async def prepare(self, send: Send) -> None:
        """Nothing: each turn is new, as in a stream of independent users."""

    async def run(self, send: Send) -> None:
        await open_loop(self.chat_arrivals(), partial(self.send_chat, send))
