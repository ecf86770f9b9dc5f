"""The operator's defaults are the API server's: what kopf hands the operator on
a real cluster (already defaulted) equals what the operator makes of an object
kmock passes through undefaulted, and what `maas operator simulate` reads."""

from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maas_operator.modeldeployment.crd_schema import OPENAPI_SCHEMA
from maas_operator.modeldeployment.defaults import defaulted_spec
from tests.k8s.apiserver_defaulting import server_defaulted

SPEC_SCHEMA = OPENAPI_SCHEMA["properties"]["spec"]
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "deploy" / "examples").glob("*.yaml"))


def values(schema: dict) -> st.SearchStrategy:
    """Any value of the schema's shape, valid or not: defaulting must agree on both."""
    kind = schema.get("type")
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if kind == "object" and "properties" in schema:
        fields = {k: st.one_of(st.none(), values(v)) for k, v in schema["properties"].items()}
        return st.fixed_dictionaries({}, optional=fields)
    if kind == "object":
        inner = schema.get("additionalProperties")
        item = values(inner) if isinstance(inner, dict) else st.text(max_size=3)
        return st.dictionaries(st.text(max_size=3), st.one_of(st.none(), item), max_size=2)
    if kind == "array":
        return st.lists(values(schema.get("items", {})), max_size=2)
    if kind == "integer":
        return st.integers(-1, 2000)
    if kind == "number":
        return st.floats(0, 2, allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    return st.text(max_size=4)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values(SPEC_SCHEMA))
def test_operator_defaults_equal_the_api_servers(spec):
    assert defaulted_spec(spec) == server_defaulted(spec, SPEC_SCHEMA)


def test_examples_and_explicit_nulls():
    for path in EXAMPLES:
        spec = yaml.safe_load(path.read_text())["spec"]
        assert defaulted_spec(spec) == server_defaulted(spec, SPEC_SCHEMA), path.name
    # A null where the schema has a default reads as the default, as on the server.
    spec = {"routing": {"policy": None}, "replicas": None, "image": None}
    defaulted = defaulted_spec(spec)
    assert defaulted == server_defaulted(spec, SPEC_SCHEMA)
    assert defaulted["routing"]["policy"] == "prefix_affinity"
    assert defaulted["replicas"] == {"min": 1, "max": 4} and "image" not in defaulted
