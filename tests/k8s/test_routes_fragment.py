"""The routes a ModelDeployment asks the gateway for (operators/modeldeployment/routes.py)."""

import yaml

from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.routes import fragment
from maas_services.gateway.routing.routing_table import RoutingTable


def test_aliases_split_between_the_model_and_its_canary_by_weight():
    spec = defaulted_spec(
        {
            "model": {"name": "smol"},
            "aliases": ["chat", "smol"],
            "canary": {"version": "v2", "weight": 25},
        }
    )
    routes = fragment("demo", spec)
    split = [{"deployment": "smol", "weight": 75}, {"deployment": "smol-canary", "weight": 25}]
    assert routes["models"] == {"smol": {"routes": split}, "chat": {"routes": split}}
    assert routes["deployments"] == {"smol-canary": {"tokenizer": "smol"}}
    # What the gateway loads: the fragment is a routing table of its own.
    table = RoutingTable.from_yaml(yaml.safe_dump(routes))
    route = table.resolve("chat", "standard", "", {"smol", "smol-canary"})
    assert route.deployment in {"smol", "smol-canary"}


def test_no_canary_without_a_version_and_min_zero_marks_the_deployment():
    spec = defaulted_spec({"canary": {"weight": 30}, "replicas": {"min": 0, "max": 2}})
    routes = fragment("demo", spec)
    assert routes["models"] == {"demo": {"routes": [{"deployment": "demo", "weight": 100}]}}
    assert routes["deployments"] == {"demo": {"scales_to_zero": True}}


def test_all_traffic_on_the_canary_lists_no_zero_weight_route():
    spec = defaulted_spec({"canary": {"version": "v2", "weight": 100}})
    assert fragment("demo", spec)["models"]["demo"]["routes"] == [
        {"deployment": "demo-canary", "weight": 100}
    ]
