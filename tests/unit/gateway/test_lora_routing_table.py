"""The routing table's `adapters:` map: a strict schema, visibility, and shared adapters."""

import pytest
from pydantic import ValidationError

from maas_services.gateway.routing.routing_table import NoDeploymentUpError, RoutingTable

TABLE = """
models:
  smollm2:
    routes: [{deployment: base}]
    tiers:
      premium: [{deployment: premium-pool}]
deployments:
  base: {tokenizer: base-tok}
adapters:
  sql-upper:
    deployment: base
    source: /models/adapters/sql-upper
    tenants: [acme]
  public-lora:
    deployment: base
    source: /models/adapters/public
    load: preload
  premium-lora:
    deployment: premium-pool
    source: /models/adapters/premium
"""
RUNNING = {"base", "premium-pool"}


def table(text: str = TABLE) -> RoutingTable:
    return RoutingTable.from_yaml(text)


def test_an_adapter_resolves_to_its_base_with_its_name_and_source():
    route = table().resolve("sql-upper", "standard", "", RUNNING, "acme")
    assert (route.deployment, route.tokenizer, route.alias) == ("base", "base-tok", "sql-upper")
    assert (route.adapter, route.adapter_source) == ("sql-upper", "/models/adapters/sql-upper")


def test_a_base_model_has_no_adapter():
    route = table().resolve("smollm2", "standard", "", RUNNING, "acme")
    assert (route.deployment, route.adapter, route.adapter_source) == ("base", "", "")


def test_a_private_adapter_is_unknown_to_other_tenants():
    assert table().resolve("sql-upper", "standard", "", RUNNING, "globex") is None
    assert table().resolve("public-lora", "standard", "", RUNNING, "globex").adapter


def test_an_adapter_of_another_tiers_pool_is_unknown():
    assert table().resolve("premium-lora", "standard", "", RUNNING, "acme") is None
    assert table().resolve("premium-lora", "premium", "", RUNNING, "acme").adapter


def test_an_adapter_whose_base_is_down_is_unavailable_not_unknown():
    with pytest.raises(NoDeploymentUpError):
        table().resolve("public-lora", "standard", "", {"premium-pool"}, "acme")


def test_shared_adapters_are_every_tenants_and_listed_ones_keep_their_visibility():
    shared = {"flagged": "base", "sql-upper": "base"}
    route = table().resolve("flagged", "standard", "", RUNNING, "globex", shared)
    assert (route.deployment, route.adapter, route.adapter_source) == ("base", "flagged", "")
    # Loaded on the engines, but listed private: still not globex's.
    assert table().resolve("sql-upper", "standard", "", RUNNING, "globex", shared) is None
    assert table().adapter_names(RUNNING, "standard", "globex", shared) == {
        "public-lora": "base",
        "flagged": "base",
    }
    assert table().adapter_names(RUNNING, "standard", "acme", shared) == {
        "sql-upper": "base",
        "public-lora": "base",
        "flagged": "base",
    }


def test_a_running_deployment_wins_over_a_shared_adapter_of_its_name():
    shared = {"base": "premium-pool", "smollm2": "base"}
    route = table().resolve("base", "standard", "", RUNNING, "acme", shared)
    assert (route.deployment, route.adapter) == ("base", "")
    assert "base" not in table().adapter_names(RUNNING, "premium", "acme", shared)
    assert "smollm2" not in table().adapter_names(RUNNING, "premium", "acme", shared)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("x: {deployment: nowhere, source: /a}", "names deployment 'nowhere'"),
        ("smollm2: {deployment: base, source: /a}", "has the name of a model"),
        ("base: {deployment: base, source: /a}", "has the name of a model"),
        ("x: {deployment: base}", "source"),
        ("x: {deployment: base, source: /a, load: lazily}", "load"),
        ("x: {deployment: base, source: /a, tennants: [acme]}", "tennants"),
    ],
)
def test_a_bad_adapter_entry_fails_the_load(entry, message):
    text = f"""
deployments:
  base: {{}}
models:
  smollm2: {{routes: [{{deployment: base}}]}}
adapters:
  {entry}
"""
    with pytest.raises(ValidationError, match=message):
        table(text)


def test_merged_fragments_keep_the_first_owner_of_a_name_across_aliases_and_adapters():
    first = table()
    fragment = RoutingTable.from_yaml(
        """
models:
  sql-upper: {routes: [{deployment: other}]}
  fresh: {routes: [{deployment: other}]}
adapters:
  smollm2: {deployment: other, source: /b}
  new-lora: {deployment: other, source: /c}
"""
    )
    merged, clashes = first.merged([fragment])
    assert sorted(clashes) == ["smollm2", "sql-upper"]
    assert merged.adapters["sql-upper"].deployment == "base"
    assert merged.adapters["new-lora"].deployment == "other"
    assert "fresh" in merged.models and "smollm2" not in merged.adapters
