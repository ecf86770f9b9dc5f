"""Who may start a grammar compile, and what it costs the tenant.

A compile is the one piece of tokenizer work a tenant can make cost seconds
(the caps and the deadline bound each one, services/common/grammar/), so
before one starts, three bounds apply:
- one compile in flight per tenant: a second is refused at once, so a
  tenant cannot queue its own compiles in front of everyone else's;
- a bounded number in flight overall (running or waiting for the worker);
- a per-tenant budget of compile CPU seconds per minute, a token bucket
  refilled continuously: each compile's CPU seconds, as the worker measured
  them (a killed compile's from the kernel), are taken from its tenant's
  bucket when it ends, and a tenant whose bucket is empty is refused until it
  refills. This is how compile time is charged to its tenant: its own
  limit, not tokens against TPM (it is CPU, not model time).
A tenant's slot is released only when its compile has really ended (the
servicer releases it from the compile's completion, not the call's): a call
cancelled by its client does not free the slot while the worker still runs.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field


class CompileRefused(Exception):
    """Not admitted; retry_after_s: when trying again may succeed."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class _Bucket:
    seconds: float
    updated: float


@dataclass
class CompileAdmission:
    # CPU seconds of compile a tenant may use per minute (also the burst).
    budget_s_per_minute: float
    max_in_flight: int
    clock: Callable[[], float] = time.monotonic
    _in_flight: set[str] = field(default_factory=set)
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def admit(self, tenant: str) -> None:
        """Take tenant's slot, or raise CompileRefused naming the bound."""
        if tenant in self._in_flight:
            raise CompileRefused(
                "this tenant already has a grammar compile in flight; at most 1 at a time", 1
            )
        if len(self._in_flight) >= self.max_in_flight:
            raise CompileRefused(
                f"{self.max_in_flight} grammar compiles are in flight, the most this "
                "tokenizer takes; retry shortly",
                1,
            )
        level = self._level(tenant)
        if level <= 0:
            raise CompileRefused(
                f"this tenant's grammar compile budget ({self.budget_s_per_minute:g} CPU "
                "seconds a minute) is spent; retry later",
                max(1, math.ceil(-level / self._rate)),
            )
        self._in_flight.add(tenant)

    def release(self, tenant: str, cpu_seconds: float) -> None:
        """The compile ended, having used cpu_seconds: charge them and free the slot."""
        self._in_flight.discard(tenant)
        level = self._level(tenant) - cpu_seconds
        if level < self.budget_s_per_minute:
            self._buckets[tenant] = _Bucket(level, self.clock())

    @property
    def _rate(self) -> float:
        return self.budget_s_per_minute / 60

    def _level(self, tenant: str) -> float:
        """The tenant's CPU seconds left now; a full bucket is forgotten (the map holds
        only tenants who compiled within the last minute or so)."""
        bucket = self._buckets.get(tenant)
        if bucket is None:
            return self.budget_s_per_minute
        now = self.clock()
        level = bucket.seconds + (now - bucket.updated) * self._rate
        if level >= self.budget_s_per_minute:
            del self._buckets[tenant]
            return self.budget_s_per_minute
        bucket.seconds, bucket.updated = level, now
        return level
