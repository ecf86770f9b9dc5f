import pytest

from maas_services.router.discovery import Routing
from maas_services.router.policies import POLICIES, resolve
from maas_services.router.pool import EnginePool
from maas_services.router.registry import FILTERS, PICKERS, SCORERS
from maas_services.router.scheduler import Profile, Scheduler
from tests.unit.router.helpers import blocks, context, deps, endpoint

PROMPT = list(range(1000, 1200))


def test_every_policy_names_registered_plugins():
    for policy in POLICIES.values():
        assert set(policy.filters) <= set(FILTERS)
        assert set(policy.weights) <= set(SCORERS)
        assert policy.picker in PICKERS


def test_resolve_overrides_weights_and_zero_turns_a_scorer_off():
    policy = resolve("prefix-affinity", {"prefix": 2, "session": 0})
    assert policy.name == "prefix_affinity"
    assert policy.weights["prefix"] == 2 and "session" not in policy.weights


@pytest.mark.parametrize(
    ("name", "weights"),
    [("fastest", {}), ("least_load", {"magic": 1}), ("least_load", {"queue": -1})],
)
def test_resolve_rejects_what_it_does_not_know(name, weights):
    with pytest.raises(ValueError):
        resolve(name, weights)


def prefix_setup(**settings):
    d = deps(**settings)
    d.index.stored("affine", blocks(PROMPT))
    return d


def test_prefix_affinity_picks_the_replica_holding_the_prompt_despite_more_load():
    d = prefix_setup()
    replicas = [
        endpoint("affine", picked_since_poll=3, waiting=1, kv_cache_usage=0.5),
        endpoint("idle"),
    ]
    decision = Profile(resolve("prefix_affinity"), d).pick(context(PROMPT), replicas)
    assert decision.endpoint.endpoint_id == "affine"
    assert decision.scores["prefix"] == 1.0


def test_overload_guard_lets_load_win_past_the_margin():
    d = prefix_setup(overload_margin=4)
    replicas = [endpoint("affine", picked_since_poll=6), endpoint("idle", picked_since_poll=1)]
    decision = Profile(resolve("prefix_affinity"), d).pick(context(PROMPT), replicas)
    assert decision.endpoint.endpoint_id == "idle"


def test_least_load_ignores_the_cache():
    d = prefix_setup()
    replicas = [endpoint("affine", picked_since_poll=2), endpoint("idle")]
    decision = Profile(resolve("least_load"), d).pick(context(PROMPT), replicas)
    assert decision.endpoint.endpoint_id == "idle"


def test_no_candidate_left_gives_none():
    d = deps()
    replicas = [endpoint("a", draining=True)]
    assert Profile(resolve("least_load"), d).pick(context(PROMPT), replicas) is None


def test_deployments_choose_their_policy_and_keep_plugin_state():
    scheduler = Scheduler(deps())
    assert scheduler.profile("m", None).policy.name == "prefix_affinity"
    rr = scheduler.profile("m", Routing("round_robin"))
    replicas = [endpoint("a"), endpoint("b")]
    first = rr.pick(context(PROMPT), replicas).endpoint.endpoint_id
    again = scheduler.profile("m", Routing("round_robin"))
    assert again is rr
    assert again.pick(context(PROMPT), replicas).endpoint.endpoint_id != first


def test_a_bad_deployment_policy_falls_back_to_the_default():
    scheduler = Scheduler(deps(routing_policy="least_load"))
    assert scheduler.profile("m", Routing("warp-speed")).policy.name == "least_load"


def test_a_bad_default_policy_fails_at_startup():
    with pytest.raises(ValueError):
        Scheduler(deps(routing_policy="warp-speed"))


def test_a_burst_of_new_prefixes_spreads_while_engine_counts_are_stale():
    # Every engine last reported 2 running (warm-up traffic since finished).
    profile = Profile(resolve("prefix_affinity"), deps())
    replicas = [endpoint(name, running=2) for name in "abcd"]
    for group in range(8):
        tokens = list(range(group * 1000, group * 1000 + 64))
        chosen = profile.pick(context(tokens, session_id=f"s{group}"), replicas).endpoint
        EnginePool.record_pick(chosen)
    assert [e.picked_since_poll for e in replicas] == [2, 2, 2, 2]
