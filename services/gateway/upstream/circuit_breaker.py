"""A circuit breaker per engine endpoint.

closed: requests flow; `threshold` failures in a row open it.
open: the endpoint is left out of picks for `cooldown` seconds.
half-open: after the cooldown one request is let through as a probe; its
success closes the breaker, its failure opens it for another cooldown.

The router already drops engines whose load reports stop, but that takes a
poll interval, and an engine can answer its health checks while failing
every Generate; the breaker reacts to what requests actually see.

Metrics: maas_gateway_breaker_transitions_total counts state changes, and
maas_gateway_breaker_state{endpoint} is read from the breakers at scrape time
(0 closed, 0.5 half-open, 1 open), so it is always in step with them, turns
half-open when a cooldown runs out, and an endpoint the router no longer lists
(`retain`) leaves the metric with its breaker.
"""

import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import Counter
from prometheus_client.core import REGISTRY, GaugeMetricFamily

from maas_services.common.logging import get_logger

log = get_logger(__name__)

TRANSITIONS = Counter("maas_gateway_breaker_transitions", "Circuit breaker state changes", ["to"])
# Ordered by how shut the endpoint is, so max() and "> 0" read naturally.
STATE_VALUES = {"closed": 0.0, "half_open": 0.5, "open": 1.0}


@dataclass
class CircuitBreaker:
    threshold: int
    cooldown: float
    failures: int = 0
    opened_at: float | None = None
    probing: bool = False

    def blocked(self, now: float) -> bool:
        if self.opened_at is None:
            return False
        return self.probing or now - self.opened_at < self.cooldown

    def begin(self, now: float) -> None:
        """A request is about to use the endpoint; past the cooldown it is the probe."""
        if self.opened_at is not None and now - self.opened_at >= self.cooldown:
            self.probing = True

    def succeeded(self) -> bool:
        """Returns True when this closed an open breaker."""
        was_open = self.opened_at is not None
        self.failures, self.opened_at, self.probing = 0, None, False
        return was_open

    def failed(self, now: float) -> bool:
        """Returns True when this opened the breaker."""
        self.failures += 1
        if self.probing or (self.opened_at is None and self.failures >= self.threshold):
            self.opened_at, self.probing = now, False
            return True
        return False


class Breakers:
    def __init__(
        self, threshold: int, cooldown: float, clock: Callable[[], float] = time.monotonic
    ):
        self._threshold = threshold
        self._cooldown = cooldown
        self._clock = clock
        self._breakers: dict[str, CircuitBreaker] = {}
        COLLECTOR.sources.add(self)

    def _get(self, endpoint_id: str) -> CircuitBreaker:
        if endpoint_id not in self._breakers:
            self._breakers[endpoint_id] = CircuitBreaker(self._threshold, self._cooldown)
        return self._breakers[endpoint_id]

    def blocked(self) -> list[str]:
        """Endpoints to leave out of the next pick."""
        now = self._clock()
        return [eid for eid, b in self._breakers.items() if b.blocked(now)]

    def begin(self, endpoint_id: str) -> None:
        self._get(endpoint_id).begin(self._clock())

    def succeeded(self, endpoint_id: str) -> None:
        if self._get(endpoint_id).succeeded():
            TRANSITIONS.labels("closed").inc()
            log.info("breaker_closed", endpoint=endpoint_id)

    def failed(self, endpoint_id: str) -> None:
        if self._get(endpoint_id).failed(self._clock()):
            TRANSITIONS.labels("open").inc()
            log.warning("breaker_opened", endpoint=endpoint_id)

    def state(self, endpoint_id: str) -> str:
        return self._state(self._get(endpoint_id), self._clock())

    @staticmethod
    def _state(breaker: CircuitBreaker, now: float) -> str:
        if breaker.opened_at is None:
            return "closed"
        if breaker.probing or now - breaker.opened_at >= breaker.cooldown:
            return "half_open"
        return "open"

    def states(self) -> dict[str, str]:
        """Every known endpoint's state now."""
        now = self._clock()
        return {eid: self._state(b, now) for eid, b in list(self._breakers.items())}

    def retain(self, endpoint_ids: Iterable[str]) -> None:
        """Forget the breakers of endpoints not listed (replicas that left the pool)."""
        keep = set(endpoint_ids)
        for eid in [eid for eid in self._breakers if eid not in keep]:
            del self._breakers[eid]
            log.info("breaker_forgotten", endpoint=eid)


class BreakerCollector:
    """maas_gateway_breaker_state of every live Breakers, read at scrape time."""

    def __init__(self) -> None:
        self.sources: weakref.WeakSet[Breakers] = weakref.WeakSet()

    def collect(self):
        family = GaugeMetricFamily(
            "maas_gateway_breaker_state",
            "Circuit breaker state per engine endpoint: 0 closed, 0.5 half-open, 1 open",
            labels=["endpoint"],
        )
        values: dict[str, float] = {}
        for source in list(self.sources):
            for eid, state in source.states().items():
                values[eid] = max(values.get(eid, 0.0), STATE_VALUES[state])
        for eid, value in sorted(values.items()):
            family.add_metric([eid], value)
        yield family


COLLECTOR = BreakerCollector()
REGISTRY.register(COLLECTOR)
