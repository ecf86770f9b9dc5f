from collections import Counter
from pathlib import Path

import pytest

from maas_services.gateway.routing.routing_table import NoDeploymentUpError, RoutingTable

CANARY = """
tiers:
  standard: {weight: 1, priority: 0}
  premium: {weight: 4, priority: 10}
models:
  smollm2:
    routes:
      - {deployment: v1, weight: 90}
      - {deployment: v2, weight: 10}
    tiers:
      premium: [{deployment: dedicated}]
deployments:
  v2: {tokenizer: v1, max_in_flight: 8}
"""
RUNNING = {"v1", "v2", "dedicated"}


def table(text=CANARY) -> RoutingTable:
    return RoutingTable.from_yaml(text)


def test_canary_split_is_within_3_percent_over_2000_picks():
    canary = table()
    picks = Counter(
        canary.resolve("smollm2", "standard", "", RUNNING).deployment for _ in range(2000)
    )
    assert abs(picks["v2"] / 2000 - 0.10) <= 0.03
    assert picks["v1"] + picks["v2"] == 2000


def test_a_session_stays_on_one_deployment():
    canary = table()
    routes = {canary.resolve("smollm2", "standard", "s-42", RUNNING).deployment for _ in range(50)}
    assert len(routes) == 1


def test_premium_tenants_get_their_pool_and_priority():
    route = table().resolve("smollm2", "premium", "", RUNNING)
    assert (route.deployment, route.tier.priority, route.tier.weight) == ("dedicated", 10, 4)


def test_deployment_options_apply():
    routes = [table().resolve("smollm2", "standard", "", {"v2"}) for _ in range(5)]
    assert {(r.deployment, r.tokenizer, r.max_in_flight) for r in routes} == {("v2", "v1", 8)}


def test_deployments_that_are_not_running_are_skipped():
    picks = {table().resolve("smollm2", "standard", "", {"v1"}).deployment for _ in range(100)}
    assert picks == {"v1"}
    with pytest.raises(NoDeploymentUpError):
        table().resolve("smollm2", "standard", "", {"other"})


def test_unknown_names_resolve_to_none_and_deployments_serve_as_themselves():
    assert table().resolve("gpt-4", "standard", "", RUNNING) is None
    assert table().resolve("v1", "standard", "", RUNNING).deployment == "v1"
    hidden = table(CANARY + "expose_deployments: false\n")
    assert hidden.resolve("v1", "standard", "", RUNNING) is None
    assert hidden.names(RUNNING) == ["smollm2"]


def test_empty_table_serves_every_running_model_and_unknown_tiers_get_defaults():
    empty = table("")
    assert empty.names({"a", "b"}) == ["a", "b"]
    route = empty.resolve("a", "no-such-tier", "", {"a"})
    assert (route.tier.weight, route.tier.priority) == (1, 0)


def test_typos_in_the_file_are_errors():
    with pytest.raises(ValueError):
        table("models:\n  x:\n    route: [{deployment: a}]\n")


def test_the_charts_routing_table_is_what_the_gateway_reads():
    import yaml

    from maas_services.gateway.routing.routing_table import RoutingTable

    values = Path(__file__).parents[3] / "charts" / "maas" / "values.yaml"
    text = yaml.safe_dump(yaml.safe_load(values.read_text())["routingTable"])
    table = RoutingTable.from_yaml(text)
    assert table.models, "the chart routes no model"


def test_a_tier_pool_cannot_be_named_directly_by_another_tier():
    canary = table()
    assert canary.resolve("dedicated", "standard", "", RUNNING) is None
    assert canary.resolve("dedicated", "no-such-tier", "", RUNNING) is None
    assert canary.resolve("dedicated", "premium", "", RUNNING).deployment == "dedicated"
    # The alias's open routes stay open to every tier, premium included.
    assert canary.resolve("v1", "premium", "", RUNNING).deployment == "v1"
    assert canary.names(RUNNING, "standard") == ["smollm2", "v1", "v2"]
    assert canary.names(RUNNING, "premium") == ["dedicated", "smollm2", "v1", "v2"]
    # Only the pool is up: the alias means nothing to a standard tenant now.
    assert canary.names({"dedicated"}, "standard") == []


OPERATOR = """
models:
  smollm2: {routes: [{deployment: stolen}]}
  chat:
    routes: [{deployment: cold, weight: 80}, {deployment: cold-canary, weight: 20}]
deployments:
  cold: {scales_to_zero: true}
  cold-canary: {tokenizer: cold}
"""


def test_operator_routes_merge_over_the_file_which_keeps_its_tiers_and_names():
    merged, clashes = table().merged([table(OPERATOR)])
    assert clashes == ["smollm2"]
    assert merged.tier("premium").weight == 4
    assert merged.resolve("smollm2", "standard", "", RUNNING).deployment in {"v1", "v2"}
    route = merged.resolve("chat", "standard", "", {"cold", "cold-canary"})
    assert route.deployment in {"cold", "cold-canary"}


def test_a_deployment_at_zero_replicas_is_routed_to_be_held_instead_of_refused():
    merged, _ = table().merged([table(OPERATOR)])
    # Neither side runs; only the main one scales to zero, so it takes the request.
    route = merged.resolve("chat", "standard", "", RUNNING)
    assert (route.deployment, route.scales_to_zero) == ("cold", True)
    assert merged.resolve("cold", "standard", "", set()).scales_to_zero
    assert "chat" in merged.names(set())
    with pytest.raises(NoDeploymentUpError):
        merged.resolve("smollm2", "standard", "", set())
