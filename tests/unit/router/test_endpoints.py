import pytest

from maas_services.router.endpoints import parse_static
from tests.unit.router.helpers import endpoint


def test_available_needs_reachable_discovered_ready_and_not_leaving():
    assert endpoint("a").available
    assert not endpoint("a", reachable=False).available
    assert not endpoint("a", discovered_ready=False).available
    assert not endpoint("a", draining=True).available
    assert not endpoint("a", terminating=True).available


def test_requests_adds_picks_the_engines_last_report_cannot_include():
    assert endpoint("a", running=2, waiting=1).requests == 3
    assert endpoint("a", running=2, waiting=3, picked_since_poll=1).requests == 6


def test_hash_params_default_to_the_model_id_as_salt():
    assert endpoint("a").hash_params == (16, "m")
    assert endpoint("a", block_size=32, cache_salt="s").hash_params == (32, "s")


def test_parse_static_accepts_named_and_bare_entries():
    assert parse_static(["e0=127.0.0.1:5000", "127.0.0.1:5001"]) == [
        ("e0", "127.0.0.1:5000"),
        ("127.0.0.1:5001", "127.0.0.1:5001"),
    ]


@pytest.mark.parametrize("entries", [["e0=nohost"], ["a=h:1", "a=h:2"]])
def test_parse_static_rejects_bad_lists(entries):
    with pytest.raises(ValueError):
        parse_static(entries)
