"""Chat traffic plus a long document every --long-every seconds: chunked prefill's case.

Without chunking, a 2,000-token prompt is computed in one step and every
chat stream on that engine stalls for it: their inter-token latency p99 is
the long prefill's time. Chunked prefill (a small --max-num-batched-tokens)
splits it over many steps that carry the decodes too. The report keeps the
two classes apart (runs.*.classes.chat / .long): the chat requests' ITL and
TPOT p99 is the number to compare between engine variants (--engine-variant).
"""

import argparse
import asyncio
import random
from dataclasses import dataclass
from functools import partial

from maas_tools.bench import arrivals, workload_args
from maas_tools.bench.loops import open_loop
from maas_tools.bench.scenario import Send
from maas_tools.bench.scenarios.chat import TEMPLATE_TOKENS, Chat
from maas_tools.bench.text import words


@dataclass
class LongPrefillMix(Chat):
    name = "long-prefill-mix"

    long_prompt_range: tuple[int, int] = (1500, 3000)
    long_every: float = 10.0
    long_max_tokens: int = 8

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        # Only its own flags: Chat's are declared by Chat (argparse refuses twice).
        group = parser.add_argument_group("long-prefill-mix")
        workload_args.add_range_argument(
            group, "--long-prompt-range", cls.long_prompt_range, "long document tokens, uniform"
        )
        group.add_argument(
            "--long-every",
            type=float,
            help=f"seconds between documents (default: {cls.long_every})",
        )
        group.add_argument(
            "--long-max-tokens",
            type=int,
            help=f"tokens generated per document (default: {cls.long_max_tokens})",
        )

    def long_arrivals(self) -> list[float]:
        """Documents arrive while the chat traffic does, never after its last request."""
        chat = self.chat_arrivals()
        return arrivals.periodic(self.long_every, until=chat[-1]) if chat else []

    def long_request(self, index: int) -> list[dict]:
        rng = random.Random(f"{self.seed}/long/{index}")
        length = rng.randint(*self.long_prompt_range)
        return [{"role": "user", "content": "Summarize this document:\n" + words(rng, length)}]

    def total_requests(self) -> int:
        return self.requests + len(self.long_arrivals())

    def working_set_tokens(self) -> int:
        documents = len(self.long_arrivals()) * self._long_tokens()
        return super().working_set_tokens() + documents

    def largest_request_tokens(self) -> int:
        return max(super().largest_request_tokens(), self._long_tokens())

    def _long_tokens(self) -> int:
        return self.long_prompt_range[1] + self.long_max_tokens + TEMPLATE_TOKENS

    async def send_long(self, send: Send, index: int) -> None:
        await send(self.long_request(index), max_tokens=self.long_max_tokens, kind="long")

    async def run(self, send: Send) -> None:
        await asyncio.gather(
            super().run(send), open_loop(self.long_arrivals(), partial(self.send_long, send))
        )
