"""What a `maas bench` workload provides; the workloads are in scenarios/.

A scenario builds its requests from a seed (so every policy in a run sees the
same workload), drives them through a `send` callable that records each
result, and judges the runs against its targets.
"""

import argparse
from collections.abc import Awaitable, Callable
from typing import ClassVar, Protocol

from services.bench.client import RequestResult

# messages, session id -> result; the runner times and records every call.
Send = Callable[[list[dict], str], Awaitable[RequestResult]]


class Scenario(Protocol):
    name: ClassVar[str]
    # Policies compared when the bench starts local mode itself, baseline last.
    default_policies: ClassVar[tuple[str, ...]]

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None: ...

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Scenario": ...

    def describe(self) -> dict:
        """Its parameters, for the report."""
        ...

    def total_requests(self) -> int: ...

    def working_set_tokens(self) -> int:
        """Distinct tokens the whole workload would keep in KV cache, about."""
        ...

    def largest_request_tokens(self) -> int: ...

    async def prepare(self, send: Send) -> None:
        """Unmeasured requests that put the service in the state the scenario measures."""
        ...

    async def run(self, send: Send) -> None: ...

    def verdict(self, runs: dict[str, dict]) -> dict:
        """Comparisons between policies' summaries, and whether targets were met."""
        ...
