import uuid

from prometheus_client import REGISTRY

from maas_services.gateway.upstream.circuit_breaker import Breakers


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_threshold_failures_in_a_row():
    clock = Clock()
    breakers = Breakers(threshold=3, cooldown=5, clock=clock)
    breakers.failed("a")
    breakers.failed("a")
    breakers.succeeded("a")  # a success resets the count
    breakers.failed("a")
    breakers.failed("a")
    assert breakers.blocked() == []
    breakers.failed("a")
    assert breakers.blocked() == ["a"] and breakers.state("a") == "open"


def test_half_open_lets_one_probe_through_then_closes_on_success():
    clock = Clock()
    breakers = Breakers(threshold=1, cooldown=5, clock=clock)
    breakers.failed("a")
    clock.now = 5
    assert breakers.blocked() == [] and breakers.state("a") == "half_open"
    breakers.begin("a")
    assert breakers.blocked() == ["a"]  # only one probe at a time
    breakers.succeeded("a")
    assert breakers.state("a") == "closed" and breakers.blocked() == []


def test_a_failed_probe_opens_it_for_another_cooldown():
    clock = Clock()
    breakers = Breakers(threshold=2, cooldown=5, clock=clock)
    breakers.failed("a")
    breakers.failed("a")
    clock.now = 6
    breakers.begin("a")
    breakers.failed("a")
    assert breakers.state("a") == "open"
    clock.now = 10
    assert breakers.blocked() == ["a"]
    clock.now = 11
    assert breakers.blocked() == []


def state_metric(endpoint: str) -> float | None:
    return REGISTRY.get_sample_value("maas_gateway_breaker_state", {"endpoint": endpoint})


def opened_total() -> float:
    return REGISTRY.get_sample_value("maas_gateway_breaker_transitions_total", {"to": "open"}) or 0


def test_the_state_gauge_follows_the_breaker_at_scrape_time():
    clock = Clock()
    breakers = Breakers(threshold=1, cooldown=5, clock=clock)
    endpoint = f"gauge-{uuid.uuid4().hex[:8]}"
    opened = opened_total()
    breakers.succeeded(endpoint)
    assert state_metric(endpoint) == 0
    breakers.failed(endpoint)
    assert state_metric(endpoint) == 1
    assert opened_total() == opened + 1
    clock.now = 5  # the cooldown ran out: nothing happened but time
    assert state_metric(endpoint) == 0.5
    breakers.begin(endpoint)
    breakers.succeeded(endpoint)
    assert state_metric(endpoint) == 0


def test_retain_forgets_endpoints_and_their_series():
    breakers = Breakers(threshold=1, cooldown=5, clock=Clock())
    kept, gone = f"kept-{uuid.uuid4().hex[:8]}", f"gone-{uuid.uuid4().hex[:8]}"
    breakers.failed(kept)
    breakers.failed(gone)
    breakers.retain({kept, "never-seen"})
    assert breakers.states() == {kept: "open"}
    assert state_metric(kept) == 1 and state_metric(gone) is None
