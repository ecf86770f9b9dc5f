"""ConsumerHealth's rules, on a clock the test moves (no sleeping)."""

from maas_services.billing.health import ConsumerHealth


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def health(clock: Clock) -> ConsumerHealth:
    return ConsumerHealth(
        unready_after_seconds=30, max_lag_seconds=300, stuck_after_seconds=60, clock=clock
    )


def test_unready_until_the_first_pass_then_while_failing():
    clock = Clock()
    h = health(clock)
    assert not h.ready and h.alive
    h.caught_up()
    assert h.ready
    h.failed()
    assert not h.ready and h.alive
    h.committed(lag=1.0)
    assert h.ready


def test_failing_for_ever_stays_live_but_a_loop_that_stops_turning_does_not():
    clock = Clock()
    h = health(clock)
    for _ in range(100):  # an outage: an attempt every 5 s, all failing
        clock.now += 5
        h.failed()
        assert h.alive and not h.ready
    clock.now += 60
    assert not h.alive


def test_a_stale_success_or_a_lag_over_the_limit_is_unready():
    clock = Clock()
    h = health(clock)
    h.caught_up()
    clock.now += 30
    assert not h.ready
    h.committed(lag=301)
    assert not h.ready
    h.committed(lag=299)
    assert h.ready
