"""Requests the gateways hold for a model with no ready replica (scale to zero).

Each gateway replica reports its whole count now and then; a report replaces
that gateway's previous one and lapses after its TTL, so a gateway that died
stops counting instead of keeping a replica up for ever.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class _Report:
    held: dict[str, int]
    expires_at: float


class HeldRequests:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._reports: dict[str, _Report] = {}

    def report(self, gateway_id: str, held: dict[str, int], ttl_seconds: float) -> None:
        counts = {model: n for model, n in held.items() if n > 0}
        self._reports[gateway_id] = _Report(counts, self._clock() + ttl_seconds)

    def held(self, model: str) -> int:
        now = self._clock()
        self._reports = {g: r for g, r in self._reports.items() if r.expires_at > now}
        return sum(r.held.get(model, 0) for r in self._reports.values())
