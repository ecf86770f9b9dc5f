"""Requests the gateways hold for a model with no ready replica (scale to zero).

Each gateway replica reports its whole count now and then; a report replaces
that gateway's previous one and lapses after its TTL, so a gateway that died
stops counting instead of keeping a replica up for ever.

A report is bounded before it is kept: its TTL, each count, how many models
and how long their names, and how many gateways report at once. The caps sit
far above any real fleet (the gateway reports every few seconds with a 10 s
TTL), and keep the sum of the counts inside the stats' int32 queue depth.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

MAX_TTL_SECONDS = 60.0
MAX_GATEWAYS = 1024
MAX_MODELS = 1024
MAX_NAME_CHARS = 253  # a Kubernetes object name
MAX_HELD = 1_000_000  # per model and gateway: the sum over MAX_GATEWAYS fits an int32


class HeldReportRefused(ValueError):
    """A report over a cap; nothing of it is kept."""


@dataclass(frozen=True)
class _Report:
    held: dict[str, int]
    expires_at: float


class HeldRequests:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._reports: dict[str, _Report] = {}

    def report(self, gateway_id: str, held: dict[str, int], ttl_seconds: float) -> None:
        if len(gateway_id) > MAX_NAME_CHARS:
            raise HeldReportRefused(f"gateway_id is over {MAX_NAME_CHARS} characters")
        if len(held) > MAX_MODELS:
            raise HeldReportRefused(f"a report names {len(held)} models; at most {MAX_MODELS}")
        if any(len(model) > MAX_NAME_CHARS for model in held):
            raise HeldReportRefused(f"a model name is over {MAX_NAME_CHARS} characters")
        ttl = 0.0 if math.isnan(ttl_seconds) else min(max(ttl_seconds, 0.0), MAX_TTL_SECONDS)
        now = self._prune()
        if gateway_id not in self._reports and len(self._reports) >= MAX_GATEWAYS:
            raise HeldReportRefused(f"{MAX_GATEWAYS} gateways report already")
        counts = {model: min(n, MAX_HELD) for model, n in held.items() if n > 0}
        self._reports[gateway_id] = _Report(counts, now + ttl)

    def held(self, model: str) -> int:
        self._prune()
        return sum(r.held.get(model, 0) for r in self._reports.values())

    def _prune(self) -> float:
        now = self._clock()
        if any(r.expires_at <= now for r in self._reports.values()):
            self._reports = {g: r for g, r in self._reports.items() if r.expires_at > now}
        return now
