"""Every enum of the CRD is what the router and the engine accept, and nothing else."""

import typing
from pathlib import Path

import pytest
import yaml

from maas_operator.modeldeployment.crd_schema import OPENAPI_SCHEMA
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.validation import validate
from maas_services.engine.settings import EngineSettings
from maas_services.router.policies import POLICIES, resolve
from maas_services.router.registry import SCORERS
from maas_services.router.settings import RouterSettings

SPEC = OPENAPI_SCHEMA["properties"]["spec"]["properties"]
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "deploy" / "examples").glob("*.yaml"))


def md(**spec) -> dict:
    return {"apiVersion": "maas.io/v1alpha1", "kind": "ModelDeployment", "spec": spec}


def test_policy_enum_and_default_are_the_routers():
    policy = SPEC["routing"]["properties"]["policy"]
    assert set(policy["enum"]) == set(POLICIES)
    assert policy["default"] == RouterSettings().routing_policy
    for name in policy["enum"]:
        assert resolve(name).name == name


def test_quantization_enum_is_what_the_engine_takes():
    quantization = SPEC["engine"]["properties"]["quantization"]
    accepted = typing.get_args(EngineSettings.model_fields["quantization"].annotation)
    assert quantization["enum"] == list(accepted)
    for method in accepted:
        assert validate(md(engine={"quantization": method})) == []
    (error,) = validate(md(engine={"quantization": "fp8"}))
    assert error.startswith("spec.engine.quantization: ")


def test_every_scorer_is_a_weight_and_no_other_name_is():
    assert validate(md(routing={"weights": dict.fromkeys(SCORERS, 1)})) == []
    (error,) = validate(md(routing={"weights": {"prefix": 2, "load": 1}}))
    names = ", ".join(sorted(SCORERS))
    assert error == f"spec.routing.weights: unknown scorer; choose from {names}"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_name_only_what_the_router_knows(path):
    # resolve raises on an unknown policy or scorer, as the router would at a bad flag.
    routing = defaulted_spec(yaml.safe_load(path.read_text())["spec"])["routing"]
    resolve(routing["policy"], routing.get("weights"))
