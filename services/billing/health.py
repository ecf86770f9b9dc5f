"""Consumer health, as Kubernetes probes and Prometheus see it.

Readiness and liveness answer different questions, so they are separate gRPC
health names. Readiness ("" and maas.v1.Billing) says billing is keeping up:
its last pass succeeded (a read, a commit, or an idle pass that proved Redis
takes writes), recently, with lag under the limit; a Redis outage, an OOM or a
READONLY replica makes it NOT_SERVING until Redis recovers. Liveness
(LIVENESS_SERVICE) says only that the consumer loop still turns: it beats on
every attempt, failed ones included, because an idle stack commits nothing and
restarting billing would not bring Redis back. Only a loop that stopped
turning (a hang, a dead task) fails it.
"""

import asyncio
import time
from collections.abc import Callable

from grpc_health.v1 import health_pb2
from prometheus_client import Gauge

from maas_services.common.grpc_server import ServerHandle

LIVENESS_SERVICE = "liveness"

LAG = Gauge("maas_billing_event_lag_seconds", "Age of the last event at commit; 0 when caught up")
LAST_COMMIT = Gauge(
    "maas_billing_last_commit_timestamp_seconds", "Unix time of the last committed event"
)
READY = Gauge("maas_billing_consumer_ready", "1 while the consumer is keeping up, else 0")


class ConsumerHealth:
    def __init__(
        self,
        unready_after_seconds: float = 30.0,
        max_lag_seconds: float = 300.0,
        stuck_after_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._unready_after = unready_after_seconds
        self._max_lag = max_lag_seconds
        self._stuck_after = stuck_after_seconds
        self._clock = clock
        self._ok = False
        self._lag = 0.0
        self._last_success = self._last_beat = clock()

    def beat(self) -> None:
        self._last_beat = self._clock()

    def committed(self, lag: float) -> None:
        LAST_COMMIT.set(time.time())
        self._succeeded(lag)

    def caught_up(self) -> None:
        self._succeeded(0.0)

    def failed(self) -> None:
        self._ok = False
        self.beat()

    def _succeeded(self, lag: float) -> None:
        self._ok = True
        self._lag = lag
        LAG.set(lag)
        self._last_success = self._clock()
        self.beat()

    @property
    def ready(self) -> bool:
        recent = self._clock() - self._last_success < self._unready_after
        return self._ok and recent and self._lag <= self._max_lag

    @property
    def alive(self) -> bool:
        return self._clock() - self._last_beat < self._stuck_after


def _status(serving: bool) -> int:
    return (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )


async def publish_health(handle: ServerHandle, health: ConsumerHealth, interval: float) -> None:
    """Mirror `health` into the gRPC health service until cancelled.

    Staleness is a matter of time passing, not of an event, so it is polled.
    """
    while True:
        ready = health.ready
        READY.set(ready)
        await handle.set_serving(ready)
        await handle.health.set(LIVENESS_SERVICE, _status(health.alive))
        await asyncio.sleep(interval)
