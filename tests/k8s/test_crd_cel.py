"""The CRD's CEL rules through a CEL interpreter, as the API server runs them."""

from pathlib import Path

import pytest
import yaml

from maas_operator.modeldeployment.crd_schema import OPENAPI_SCHEMA
from maas_operator.modeldeployment.validation import cel_program, cel_value, validate

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "deploy" / "examples").glob("*.yaml"))


def rules(schema: dict) -> list[str]:
    found = [r["rule"] for r in schema.get("x-kubernetes-validations", [])]
    for prop in schema.get("properties", {}).values():
        found += rules(prop)
    return found


def md(**spec) -> dict:
    return {"apiVersion": "maas.io/v1alpha1", "kind": "ModelDeployment", "spec": spec}


def test_the_crd_has_rules_and_each_compiles():
    found = rules(OPENAPI_SCHEMA)
    assert len(found) >= 3
    for rule in found:
        cel_program(rule)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_pass_every_rule(path):
    assert validate(yaml.safe_load(path.read_text())) == []


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"replicas": {"min": 5, "max": 2}}, "spec.replicas: min must not exceed max"),
        # Only max given: the rule sees min's default (1), as after server-side defaulting.
        ({"replicas": {"max": 0}}, None),
        (
            {"autoscaling": {"prewarmWatermark": 0.95}},
            "spec.autoscaling: need scaleInWatermark < prewarmWatermark <= scaleOutWatermark",
        ),
        (
            {"routing": {"weights": {"load": 1}}},
            "spec.routing.weights: unknown scorer; choose from "
            "adapter, kv_cache, prefix, queue, requests, session",
        ),
    ],
)
def test_bad_specs_fail_with_the_rules_message(spec, error):
    errors = validate(md(**spec))
    if error is None:  # replicas.max 0 is below the schema's minimum: no CEL message at all
        assert errors and all("min must not exceed max" not in e for e in errors), errors
    else:
        assert errors == [error]


def test_numbers_are_doubles_even_when_written_as_integers():
    # 1 in YAML is an int; CEL would refuse to compare it with the double 0.6 untyped.
    assert validate(md(autoscaling={"scaleOutWatermark": 1, "prewarmWatermark": 0.6})) == []
    schema = OPENAPI_SCHEMA["properties"]["spec"]["properties"]["autoscaling"]
    typed = cel_value({"scaleOutWatermark": 1}, schema)
    assert type(typed["scaleOutWatermark"]).__name__ == "DoubleType"
