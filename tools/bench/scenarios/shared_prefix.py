"""Shared-prefix multi-turn chat, shaped like production-stack's multi-round-qa.

Groups of users share a long system prompt (a team's agent instructions, a
product's docs); each user holds a conversation whose history grows every
round, so every request resends its group's prompt plus the whole
conversation so far. Users arrive one by one, in a seeded random order.
Compared: prefix_affinity against round_robin.

Measured in steady state: before the clock starts each group's system prompt
is sent once, as a long-running service would long since have seen it, so a
short run isn't dominated by eight cold 1,000-token prefills that every policy
pays alike. --cold-start measures from empty caches instead.
"""

import argparse
import asyncio
import random
from dataclasses import asdict, dataclass

from maas_tools.bench.loops import open_loop
from maas_tools.bench.scenario import Send
from maas_tools.bench.text import words

# Chat-template tokens around each message (role header, end marker), about.
TEMPLATE_TOKENS_PER_MESSAGE = 6


@dataclass
class SharedPrefix:
    name = "shared-prefix"
    default_policies = ("prefix_affinity", "round_robin")
    # A third of the working set: affinity pays off only when caches must choose.
    kv_cache_fraction = 1 / 3

    groups: int = 8
    users_per_group: int = 2
    rounds: int = 3
    system_prompt_tokens: int = 1000
    question_tokens: int = 40
    arrival_interval: float = 0.25
    cold_start: bool = False
    max_tokens: int = 16
    seed: int = 0

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("shared-prefix")
        group.add_argument("--groups", type=int, default=cls.groups)
        group.add_argument("--users-per-group", type=int, default=cls.users_per_group)
        group.add_argument("--rounds", type=int, default=cls.rounds, help="turns per user")
        group.add_argument("--system-prompt-tokens", type=int, default=cls.system_prompt_tokens)
        group.add_argument("--question-tokens", type=int, default=cls.question_tokens)
        group.add_argument(
            "--arrival-interval",
            type=float,
            default=cls.arrival_interval,
            help="seconds between users' first requests",
        )
        group.add_argument(
            "--cold-start",
            action="store_true",
            help="don't send each group's system prompt once before measuring",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "SharedPrefix":
        return cls(
            groups=args.groups,
            users_per_group=args.users_per_group,
            rounds=args.rounds,
            system_prompt_tokens=args.system_prompt_tokens,
            question_tokens=args.question_tokens,
            arrival_interval=args.arrival_interval,
            cold_start=args.cold_start,
            max_tokens=args.max_tokens,
            seed=args.seed,
        )

    def describe(self) -> dict:
        return asdict(self)

    @property
    def users(self) -> int:
        return self.groups * self.users_per_group

    def total_requests(self) -> int:
        return self.users * self.rounds

    def _turn_tokens(self) -> int:
        return self.question_tokens + self.max_tokens + 2 * TEMPLATE_TOKENS_PER_MESSAGE

    def working_set_tokens(self) -> int:
        system = self.groups * (self.system_prompt_tokens + TEMPLATE_TOKENS_PER_MESSAGE)
        return system + self.users * self.rounds * self._turn_tokens()

    def largest_request_tokens(self) -> int:
        return self.system_prompt_tokens + self.rounds * self._turn_tokens() + self.max_tokens

    def system_prompt(self, group: int) -> str:
        return words(random.Random(f"{self.seed}/system/{group}"), self.system_prompt_tokens)

    def question(self, group: int, user: int, turn: int) -> str:
        rng = random.Random(f"{self.seed}/question/{group}/{user}/{turn}")
        return words(rng, self.question_tokens)

    async def prepare(self, send: Send) -> None:
        if self.cold_start:
            return
        await asyncio.gather(
            *(
                send(
                    [
                        {"role": "system", "content": self.system_prompt(group)},
                        {"role": "user", "content": "hello"},
                    ],
                    f"group{group}-prime",
                )
                for group in range(self.groups)
            )
        )

    async def run(self, send: Send) -> None:
        arrivals = [(g, u) for g in range(self.groups) for u in range(self.users_per_group)]
        random.Random(f"{self.seed}/arrivals").shuffle(arrivals)

        async def conversation(position: int) -> None:
            group, user = arrivals[position]
            messages = [{"role": "system", "content": self.system_prompt(group)}]
            for turn in range(self.rounds):
                messages.append({"role": "user", "content": self.question(group, user, turn)})
                result = await send(list(messages), f"group{group}-user{user}")
                if not result.ok:
                    return  # without its answer the conversation can't go on
                messages.append({"role": "assistant", "content": result.text})

        await open_loop([i * self.arrival_interval for i in range(len(arrivals))], conversation)

    def verdict(self, runs: dict[str, dict]) -> dict:
        affinity, baseline = runs.get("prefix_affinity"), runs.get("round_robin")
        if not affinity or not baseline:
            return {}
        checks = {
            # round_robin's mean TTFT over prefix_affinity's: how many times lower.
            "ttft_mean_lower_x": (
                _ratio(baseline["ttft_s"].get("mean"), affinity["ttft_s"].get("mean")),
                2.5,
            ),
            "prefix_cache_hit_rate_higher_x": (
                _ratio(affinity["prefix_cache"]["hit_rate"], baseline["prefix_cache"]["hit_rate"]),
                3.0,
            ),
            "output_throughput_x": (
                _ratio(
                    affinity["throughput"]["output_tokens_per_s"],
                    baseline["throughput"]["output_tokens_per_s"],
                ),
                1.0,
            ),
        }
        return {
            name: {"value": value, "target": f">= {target}", "met": value >= target}
            for name, (value, target) in checks.items()
        }


def _ratio(numerator: float | None, denominator: float | None) -> float:
    if not numerator or not denominator:
        return float("inf") if numerator else 0.0
    return round(numerator / denominator, 3)
