from maas_services.router.filters.available import AvailableFilter
from maas_services.router.filters.overload import OverloadFilter
from maas_services.router.pickers.max_score import MaxScorePicker
from maas_services.router.pickers.round_robin import RoundRobinPicker
from tests.unit.router.helpers import context, endpoint


def ids(endpoints) -> list[str]:
    return [e.endpoint_id for e in endpoints]


def test_available_drops_unready_draining_and_excluded():
    candidates = [
        endpoint("ok"),
        endpoint("down", reachable=False),
        endpoint("draining", draining=True),
        endpoint("failed-before"),
    ]
    kept = AvailableFilter().filter(context(exclude=frozenset({"failed-before"})), candidates)
    assert ids(kept) == ["ok"]


def test_overload_drops_replicas_beyond_the_margin_over_the_least_loaded():
    candidates = [
        endpoint("a", picked_since_poll=9),
        endpoint("b", waiting=2),
        endpoint("c", running=5),
    ]
    assert ids(OverloadFilter(margin=3).filter(context(), candidates)) == ["b", "c"]
    assert ids(OverloadFilter(margin=7).filter(context(), candidates)) == ["a", "b", "c"]


def test_max_score_takes_the_best():
    a, b = endpoint("a"), endpoint("b")
    assert MaxScorePicker().pick(context(), [(a, 1.0), (b, 2.5)]) is b


def test_max_score_breaks_ties_by_prompt_so_equal_prompts_agree():
    replicas = [endpoint(name) for name in "abcd"]
    ranked = [(e, 1.0) for e in replicas]
    chosen = {MaxScorePicker().pick(context([7] * 40), ranked).endpoint_id for _ in range(5)}
    assert len(chosen) == 1
    spread = {MaxScorePicker().pick(context([i] * 40), ranked).endpoint_id for i in range(40)}
    assert len(spread) == 4


def test_round_robin_takes_turns_in_id_order():
    picker = RoundRobinPicker()
    ranked = [(endpoint(name), 0.0) for name in "cab"]
    assert [picker.pick(context(), ranked).endpoint_id for _ in range(4)] == ["a", "b", "c", "a"]
