"""The watermark autoscaling policy: pure functions, no Kubernetes.

One call to `decide` per observation of the pool. Utilisation is queue depth
over the capacity of ready replicas. Decisions use the capacity on the way
instead (every replica asked for, starting ones included, minus any draining),
so a burst while weights load asks once, not once per tick:

* >= scaleOutWatermark: scale out at once, cooldown or not, to the replica
  count that brings utilisation under prewarmWatermark;
* >= prewarmWatermark: one more replica, at most once per cooldown;
* < scaleInWatermark for the whole stabilisation window, nothing starting or
  draining, and one replica fewer would still sit under prewarmWatermark:
  drain one replica. The window restarts after each scale-in and whenever
  utilisation comes back up, which is the hysteresis: noise around a
  watermark never completes a window.

min/max bound the replicas that serve; a draining replica is on its way out
and is counted on top until it is removed.

With min 0 the last replica goes only after scaleToZeroAfterSeconds with no
request at all (none waiting, none running), not after the stabilisation
window: a cold start costs a request its whole start-up time. From zero, any
queue (the gateways' held requests count in it) scales out at once.
"""

import math
from dataclasses import dataclass, replace
from enum import StrEnum


class Action(StrEnum):
    STEADY = "steady"
    PREWARM = "prewarm"
    SCALE_OUT = "scale-out"
    SCALE_IN = "scale-in"
    BOUND = "bound"  # brought back inside [min, max] after a spec change
    COOLDOWN = "cooldown"  # wants to pre-warm, too soon after the last scale
    AT_MAX = "at-max"  # wants more replicas than max allows
    STABILIZING = "stabilizing"  # low, waiting for the window to complete
    DRAINING = "draining"  # a scale-in is finishing; nothing else until then


@dataclass(frozen=True)
class AutoscalingConfig:
    min_replicas: int = 1
    max_replicas: int = 4
    queue_capacity_per_replica: int = 32
    prewarm_watermark: float = 0.6
    scale_out_watermark: float = 0.9
    scale_in_watermark: float = 0.3
    stabilization_seconds: float = 300.0
    cooldown_seconds: float = 60.0
    scale_to_zero_after_seconds: float = 600.0


@dataclass(frozen=True)
class Observation:
    now: float  # seconds, any monotonic origin
    queue_depth: int
    ready_replicas: int  # taking requests: ready and not draining
    desired_replicas: int  # replicas asked for: ready, starting and draining
    draining_replicas: int = 0
    running: int = 0  # requests running on the replicas; with queue_depth, activity


@dataclass(frozen=True)
class AutoscalerState:
    """What the policy remembers between observations."""

    last_scale_time: float | None = None
    low_since: float | None = None
    idle_since: float | None = None  # no request waiting or running since


@dataclass(frozen=True)
class Decision:
    action: Action
    desired_replicas: int  # replicas to ask for, draining ones included
    utilization: float  # queue depth / ready capacity
    limited: bool  # max (or min) keeps the policy from what it wants
    message: str
    state: AutoscalerState


def utilization(queue_depth: int, replicas: int, capacity: int) -> float:
    """Queue depth over the capacity of `replicas`; with none, over one replica's."""
    return queue_depth / (max(replicas, 1) * capacity)


def replicas_for(queue_depth: int, config: AutoscalingConfig) -> int:
    """The fewest replicas that put utilisation strictly under the pre-warm watermark."""
    per_replica = config.queue_capacity_per_replica * config.prewarm_watermark
    return math.floor(queue_depth / per_replica) + 1


def decide(config: AutoscalingConfig, obs: Observation, state: AutoscalerState) -> Decision:
    cap = config.queue_capacity_per_replica
    serving = obs.desired_replicas - obs.draining_replicas  # ready + starting
    current = utilization(obs.queue_depth, obs.ready_replicas, cap)
    on_the_way = utilization(obs.queue_depth, serving, cap)
    # Utilisation counted against replicas that do not exist is never "low".
    low = on_the_way < config.scale_in_watermark and serving > 0
    low_since = (state.low_since if state.low_since is not None else obs.now) if low else None
    idle = obs.queue_depth == 0 and obs.running == 0
    idle_since = (state.idle_since if state.idle_since is not None else obs.now) if idle else None
    state = replace(state, low_since=low_since, idle_since=idle_since)

    def decision(action, serving_target, limited, message, scaled=False):
        new_state = replace(state, last_scale_time=obs.now) if scaled else state
        if action is Action.SCALE_IN:
            new_state = replace(new_state, low_since=obs.now)
        return Decision(
            action,
            serving_target + obs.draining_replicas,
            current,
            limited,
            message,
            new_state,
        )

    if serving < config.min_replicas:
        return decision(
            Action.BOUND, config.min_replicas, False, f"raised to min {config.min_replicas}", True
        )
    if serving > config.max_replicas:
        return decision(
            Action.BOUND, config.max_replicas, False, f"lowered to max {config.max_replicas}", True
        )

    # With nothing serving, any queue is more than the capacity on the way.
    if on_the_way >= config.scale_out_watermark or (serving == 0 and obs.queue_depth > 0):
        wanted = replicas_for(obs.queue_depth, config)
        target = min(wanted, config.max_replicas)
        limited = wanted > config.max_replicas
        if target <= serving:
            return decision(Action.AT_MAX, serving, limited, f"wants {wanted}, max is {target}")
        return decision(
            Action.SCALE_OUT,
            target,
            limited,
            f"utilisation {on_the_way:.2f} >= {config.scale_out_watermark}: "
            f"{serving} -> {target} replicas" + (f" (wanted {wanted})" if limited else ""),
            True,
        )

    if on_the_way >= config.prewarm_watermark:
        if serving >= config.max_replicas:
            return decision(Action.AT_MAX, serving, True, f"at max {config.max_replicas}")
        since = None if state.last_scale_time is None else obs.now - state.last_scale_time
        if since is not None and since < config.cooldown_seconds:
            return decision(
                Action.COOLDOWN,
                serving,
                False,
                f"pre-warm waits {config.cooldown_seconds - since:.0f}s more for the cooldown",
            )
        return decision(
            Action.PREWARM,
            serving + 1,
            False,
            f"utilisation {on_the_way:.2f} >= {config.prewarm_watermark}: "
            f"pre-warming replica {serving + 1}",
            True,
        )

    if obs.draining_replicas:
        return decision(Action.DRAINING, serving, False, "a replica is draining")
    if low_since is None:
        return decision(Action.STEADY, serving, False, "within watermarks")
    if serving <= config.min_replicas:
        return decision(Action.STEADY, serving, True, f"at min {config.min_replicas}")
    starting = serving - obs.ready_replicas
    if serving == 1:
        return _to_zero(config, obs, idle_since, starting, decision)
    waited = obs.now - low_since
    if starting > 0 or waited < config.stabilization_seconds:
        return decision(
            Action.STABILIZING,
            serving,
            False,
            f"low for {waited:.0f}s of {config.stabilization_seconds:.0f}s"
            + (f", {starting} starting" if starting > 0 else ""),
        )
    fewer = serving - 1
    if utilization(obs.queue_depth, fewer, cap) >= config.prewarm_watermark:
        return decision(Action.STEADY, serving, False, "one replica fewer would pre-warm again")
    return decision(
        Action.SCALE_IN,
        serving - 1,
        False,
        f"utilisation {on_the_way:.2f} < {config.scale_in_watermark} for "
        f"{waited:.0f}s: draining one of {serving} replicas",
        True,
    )


def _to_zero(config: AutoscalingConfig, obs: Observation, idle_since, starting: int, decision):
    """min is 0 and one replica serves: remove it once idle long enough."""
    if idle_since is None:
        return decision(Action.STEADY, 1, False, "the last replica is serving requests")
    idle_for = obs.now - idle_since
    if starting > 0 or idle_for < config.scale_to_zero_after_seconds:
        return decision(
            Action.STABILIZING,
            1,
            False,
            f"idle for {idle_for:.0f}s of {config.scale_to_zero_after_seconds:.0f}s "
            "before scaling to zero",
        )
    return decision(
        Action.SCALE_IN,
        0,
        False,
        f"no request for {idle_for:.0f}s: draining the last replica (scale to zero)",
        True,
    )
