import pytest

from services.router.endpoints import Endpoint, parse_static
from services.router.least_load import pick_least_loaded


def endpoint(eid: str, **load) -> Endpoint:
    return Endpoint(endpoint_id=eid, address=f"{eid}:1", ready=True, **load)


def test_fewest_in_flight_wins():
    picked = pick_least_loaded([endpoint("a", in_flight=3), endpoint("b", in_flight=1)])
    assert picked.endpoint_id == "b"


def test_engine_queue_breaks_ties():
    picked = pick_least_loaded(
        [endpoint("a", in_flight=1, waiting=4), endpoint("b", in_flight=1, running=1)]
    )
    assert picked.endpoint_id == "b"


def test_no_candidates_gives_none():
    assert pick_least_loaded([]) is None


def test_draining_or_unready_is_not_available():
    assert not Endpoint("a", "h:1", ready=True, draining=True).available
    assert not Endpoint("a", "h:1", ready=False).available


def test_parse_static_accepts_named_and_bare_entries():
    parsed = parse_static(["e0=127.0.0.1:5000", "127.0.0.1:5001"])
    assert [(e.endpoint_id, e.address) for e in parsed] == [
        ("e0", "127.0.0.1:5000"),
        ("127.0.0.1:5001", "127.0.0.1:5001"),
    ]


@pytest.mark.parametrize("entries", [["e0=nohost"], ["a=h:1", "a=h:2"]])
def test_parse_static_rejects_bad_lists(entries):
    with pytest.raises(ValueError):
        parse_static(entries)
