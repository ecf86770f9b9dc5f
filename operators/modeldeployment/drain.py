"""Drain planning for scale-in: which replica goes, and when it may be removed.

Pure: the autoscale step feeds in the router's replica statistics and acts on
the answer (engine Drain, pod-deletion-cost, replicas - 1).
"""

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class Replica:
    endpoint_id: str
    address: str
    ready: bool
    draining: bool
    running: int
    waiting: int
    in_flight: int
    adapters: tuple[str, ...] = ()  # LoRA adapters its load report lists

    @property
    def busy(self) -> int:
        return self.running + self.waiting + self.in_flight


@dataclass(frozen=True)
class DrainState:
    endpoint_id: str
    address: str
    pod: str  # the pod to remove when the drain ends
    started_at: float


class DrainStep(StrEnum):
    WAIT = "wait"  # requests still in flight
    REMOVE = "remove"  # finished: delete exactly this pod
    TIMED_OUT = "timed-out"  # still busy past the timeout: remove it anyway
    GONE = "gone"  # the replica vanished (pod died): just lower replicas


def choose_victim(replicas: list[Replica]) -> Replica | None:
    """The serving replica with the least work in hand: the cheapest drain."""
    serving = [r for r in replicas if r.ready and not r.draining]
    if not serving:
        return None
    return min(serving, key=lambda r: (r.busy, r.endpoint_id))


def next_step(
    drain: DrainState, replicas: list[Replica], now: float, timeout_seconds: float
) -> DrainStep:
    replica = next((r for r in replicas if r.endpoint_id == drain.endpoint_id), None)
    if replica is None:
        return DrainStep.GONE
    if replica.busy == 0:
        return DrainStep.REMOVE
    if now - drain.started_at >= timeout_seconds:
        return DrainStep.TIMED_OUT
    return DrainStep.WAIT
