"""What a `maas bench` workload provides; the workloads are in scenarios/.

A scenario builds its requests from a seed (so every policy in a run sees the
same workload), drives them through a `send` callable that records each
result, and judges the runs against its targets.
"""

import argparse
from collections.abc import Awaitable
from typing import ClassVar, Protocol

from maas_tools.bench.client import RequestResult


class Send(Protocol):
    """Sends one request; the runner times and records every call.

    max_tokens overrides the run's --max-tokens for this request (workloads
    with random output lengths); kind names its class in a mixed workload,
    so the report can summarize each class apart.
    """

    def __call__(
        self, messages: list[dict], session: str = "", *, max_tokens: int = 0, kind: str = ""
    ) -> Awaitable[RequestResult]: ...


class Scenario(Protocol):
    name: ClassVar[str]
    # Policies compared when the bench starts local mode itself, baseline last.
    default_policies: ClassVar[tuple[str, ...]]
    # Default --kv-cache-fraction: a share of the working set when the
    # scenario is about cache pressure, 0 (the engine's own sizing) when not.
    kv_cache_fraction: ClassVar[float]

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


class SingleStack:
    """Defaults for workloads that measure one stack, not a routing comparison.

    They run once, under the default policy, on engines with their own KV
    cache sizing (the workload isn't about cache pressure), and judge nothing
    between runs: goodput against the SLO flags is in each run's summary.
    """

    default_policies: ClassVar[tuple[str, ...]] = ("prefix_affinity",)
    kv_cache_fraction: ClassVar[float] = 0.0

    def verdict(self, runs: dict[str, dict]) -> dict:
        return {}
