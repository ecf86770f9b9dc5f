"""The pure autoscaling policy: watermarks, bounds, starting capacity, hysteresis."""

import random

import pytest

from maas_operator.modeldeployment.policy import (
    Action,
    AutoscalerState,
    AutoscalingConfig,
    Observation,
    decide,
    replicas_for,
)
from maas_operator.modeldeployment.simulate import simulate

CONFIG = AutoscalingConfig(
    min_replicas=1,
    max_replicas=8,
    queue_capacity_per_replica=10,
    prewarm_watermark=0.6,
    scale_out_watermark=0.9,
    scale_in_watermark=0.3,
    stabilization_seconds=60,
    cooldown_seconds=30,
)


def observe(queue, ready, desired=None, now=1000.0, draining=0):
    return Observation(now, queue, ready, ready if desired is None else desired, draining)


def test_below_prewarm_holds():
    decision = decide(CONFIG, observe(queue=5, ready=1), AutoscalerState())
    assert decision.action is Action.STEADY and decision.desired_replicas == 1


def test_prewarm_adds_exactly_one_replica_at_sixty_percent():
    decision = decide(CONFIG, observe(queue=12, ready=2), AutoscalerState())
    assert decision.action is Action.PREWARM
    assert decision.desired_replicas == 3
    assert decision.utilization == pytest.approx(0.6)


def test_prewarm_respects_the_cooldown():
    state = AutoscalerState(last_scale_time=990.0)
    held = decide(CONFIG, observe(queue=12, ready=2), state)
    assert held.action is Action.COOLDOWN and held.desired_replicas == 2
    later = decide(CONFIG, observe(queue=12, ready=2, now=1021.0), state)
    assert later.action is Action.PREWARM and later.desired_replicas == 3


def test_scale_out_ignores_cooldown_and_lands_under_sixty_percent():
    state = AutoscalerState(last_scale_time=999.0)
    decision = decide(CONFIG, observe(queue=50, ready=2), state)
    assert decision.action is Action.SCALE_OUT
    # 50 / (n * 10) < 0.6 needs n >= 9; max is 8.
    assert decision.desired_replicas == 8 and decision.limited
    unlimited = decide(CONFIG, observe(queue=30, ready=2), state)
    assert unlimited.desired_replicas == 6 and not unlimited.limited
    assert 30 / (6 * 10) < 0.6 <= 30 / (5 * 10)


@pytest.mark.parametrize("queue", [0, 1, 5, 6, 17, 18, 59, 60, 61, 600])
def test_replicas_for_is_the_fewest_under_prewarm(queue):
    n = replicas_for(queue, CONFIG)
    assert queue / (n * 10) < 0.6
    assert n == 1 or queue / ((n - 1) * 10) >= 0.6


def test_starting_replicas_count_as_capacity_on_the_way():
    # 2 ready + 2 loading weights; 20 waiting is 100% of the ready ones, but
    # only 50% of what is coming: no further scale-out.
    decision = decide(CONFIG, observe(queue=20, ready=2, desired=4), AutoscalerState())
    assert decision.utilization == pytest.approx(1.0)
    assert decision.action is Action.STEADY and decision.desired_replicas == 4


def test_min_and_max_are_hard_bounds():
    raised = decide(CONFIG, observe(queue=0, ready=0, desired=0), AutoscalerState())
    assert raised.action is Action.BOUND and raised.desired_replicas == 1
    lowered = decide(CONFIG, observe(queue=100, ready=12), AutoscalerState())
    assert lowered.action is Action.BOUND and lowered.desired_replicas == 8
    at_max = decide(CONFIG, observe(queue=70, ready=8), AutoscalerState())
    assert at_max.action is Action.AT_MAX and at_max.desired_replicas == 8 and at_max.limited


def test_scale_in_only_after_a_full_stabilisation_window():
    state = AutoscalerState()
    first = decide(CONFIG, observe(queue=0, ready=3, now=0.0), state)
    assert first.action is Action.STABILIZING and first.state.low_since == 0.0
    waiting = decide(CONFIG, observe(queue=0, ready=3, now=59.0), first.state)
    assert waiting.action is Action.STABILIZING and waiting.desired_replicas == 3
    drained = decide(CONFIG, observe(queue=0, ready=3, now=60.0), waiting.state)
    assert drained.action is Action.SCALE_IN and drained.desired_replicas == 2
    # The window starts over after each scale-in: one replica per window.
    again = decide(CONFIG, observe(queue=0, ready=2, now=61.0), drained.state)
    assert again.action is Action.STABILIZING


def test_no_scale_in_while_draining_or_starting_or_at_min():
    low = AutoscalerState(low_since=0.0)
    draining = decide(CONFIG, observe(queue=0, ready=2, desired=3, draining=1), low)
    assert draining.action is Action.DRAINING and draining.desired_replicas == 3
    starting = decide(CONFIG, observe(queue=0, ready=2, desired=3), low)
    assert starting.action is Action.STABILIZING and starting.desired_replicas == 3
    at_min = decide(CONFIG, observe(queue=0, ready=1), low)
    assert at_min.action is Action.STEADY and at_min.limited


def test_a_rise_resets_the_window():
    state = decide(CONFIG, observe(queue=0, ready=3, now=0.0), AutoscalerState()).state
    bump = decide(CONFIG, observe(queue=12, ready=3, now=50.0), state)
    assert bump.state.low_since is None
    after = decide(CONFIG, observe(queue=0, ready=3, now=70.0), bump.state)
    assert after.action is Action.STABILIZING  # 20 s into a new window, not 70


def test_scale_to_zero_after_idle_time_not_the_stabilisation_window():
    config = AutoscalingConfig(
        **{**CONFIG.__dict__, "min_replicas": 0, "scale_to_zero_after_seconds": 600}
    )
    low = AutoscalerState(low_since=0.0)
    busy = decide(config, observe(queue=1, ready=1), low)
    assert busy.action is Action.STEADY and busy.desired_replicas == 1
    # Nothing waiting but one request running: not idle, the clock does not start.
    running = decide(config, Observation(1000.0, 0, 1, 1, running=1), low)
    assert running.action is Action.STEADY and running.state.idle_since is None
    idle = decide(config, observe(queue=0, ready=1, now=1000.0), running.state)
    assert idle.action is Action.STABILIZING and idle.desired_replicas == 1
    assert idle.state.idle_since == 1000.0
    # The stabilisation window (60 s) is long past; the idle time (600 s) is not.
    early = decide(config, observe(queue=0, ready=1, now=1599.0), idle.state)
    assert early.action is Action.STABILIZING
    gone = decide(config, observe(queue=0, ready=1, now=1600.0), early.state)
    assert gone.action is Action.SCALE_IN and gone.desired_replicas == 0
    # At zero, one held request (in the queue depth) starts a replica at once.
    woken = decide(config, observe(queue=1, ready=0, desired=0), gone.state)
    assert woken.action is Action.SCALE_OUT and woken.desired_replicas == 1


def test_a_request_restarts_the_idle_clock():
    config = AutoscalingConfig(**{**CONFIG.__dict__, "min_replicas": 0})
    state = decide(config, observe(queue=0, ready=1, now=0.0), AutoscalerState()).state
    state = decide(config, observe(queue=1, ready=1, now=500.0), state).state
    assert state.idle_since is None
    later = decide(config, observe(queue=0, ready=1, now=700.0), state)
    assert later.action is Action.STABILIZING and later.state.idle_since == 700.0


def _changes(rows) -> int:
    return sum(
        a["desired_replicas"] != b["desired_replicas"] for a, b in zip(rows, rows[1:], strict=False)
    )


def test_noise_around_the_prewarm_watermark_does_not_flap():
    # Two replicas' utilisation jitters 0.5..0.7 around 0.6 for ten minutes.
    rng = random.Random(7)
    trace = [(float(t), rng.randint(10, 14)) for t in range(0, 600, 5)]
    rows = simulate(CONFIG, trace, startup_delay=20, initial_replicas=2)
    desired = [r["desired_replicas"] for r in rows]
    # One pre-warm (2 -> 3) on the first high sample, then nothing: at 3
    # replicas the noise sits between the scale-in and pre-warm watermarks.
    assert set(desired) == {3}
    assert [r["action"] for r in rows].count("prewarm") == 1


def test_noise_around_the_scale_in_watermark_does_not_flap():
    # Three replicas' utilisation jitters 0.2..0.4 around 0.3 for fifteen
    # minutes: every rise restarts the window, so nothing is drained.
    rng = random.Random(11)
    trace = [(float(t), rng.choice([6, 7, 8, 10, 11, 12])) for t in range(0, 900, 5)]
    rows = simulate(CONFIG, trace, startup_delay=20, initial_replicas=3)
    assert _changes(rows) == 0
    # The same length of steady low load does drain: the test can tell the difference.
    quiet = simulate(CONFIG, [(t, 6) for t, _ in trace], startup_delay=20, initial_replicas=3)
    assert quiet[-1]["desired_replicas"] < 3
