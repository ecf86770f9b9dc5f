"""docs/gie.md's InferencePool, route and NetworkPolicy against the operator's engine pods.

The manifests are read from the page itself, so what a user copies is what is
checked: the InferencePool must be valid under GIE's own schema and CEL rules
(tests/k8s/schemas/inferencepool-v1.json), select exactly the main track's pods
of its ModelDeployment, and target the port those pods' engines really serve
the OpenAI front on; the route must send to that pool with the token header,
and the NetworkPolicy must be a valid one opening that port on those pods.
"""

import json
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from maas_operator.modeldeployment import resources
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.validation import cel_program, cel_value
from maas_services.engine.settings import EngineSettings
from tests.k8s.written_objects import KUBERNETES_VERSION

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "gie.md"
SCHEMA = json.loads((Path(__file__).parent / "schemas" / "inferencepool-v1.json").read_text())
OWNER = {"metadata": {"name": "smollm2", "namespace": "models", "uid": "u-1"}}


def manifests() -> dict[str, dict]:
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    found = [doc for block in blocks for doc in yaml.safe_load_all(block) if doc]
    return {doc["kind"]: doc for doc in found}


def pod(spec: dict, track: str = "main") -> dict:
    return resources.deployment(OWNER, spec, "maas:1", 1, track=track)["spec"]["template"]


def selects(match_labels: dict, labels: dict) -> bool:
    return all(labels.get(key) == value for key, value in match_labels.items())


def cel_errors(value, schema: dict, path: str = "") -> list[str]:
    """Every x-kubernetes-validations rule of the schema, run where it sits."""
    errors = [
        f"{path}: {rule['message']}"
        for rule in schema.get("x-kubernetes-validations", [])
        if not cel_program(rule["rule"]).evaluate({"self": cel_value(value, schema)})
    ]
    if isinstance(value, dict):
        for name, prop in schema.get("properties", {}).items():
            if name in value:
                errors += cel_errors(value[name], prop, f"{path}.{name}")
    return errors


def with_defaults(value, schema: dict):
    """The object as the API server stores it: schema defaults filled in."""
    if not isinstance(value, dict):
        return value
    out = dict(value)
    for name, prop in schema.get("properties", {}).items():
        if name not in out and "default" in prop:
            out[name] = prop["default"]
        if name in out:
            out[name] = with_defaults(out[name], prop)
    return out


def test_the_pool_is_valid_under_gies_schema_and_rules():
    pool = manifests()["InferencePool"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    jsonschema.Draft202012Validator(SCHEMA).validate(pool)
    assert cel_errors(with_defaults(pool, SCHEMA), SCHEMA) == []


def test_the_rules_run_here_refuse_what_the_api_server_refuses():
    pool = manifests()["InferencePool"]
    twice = {**pool, "spec": {**pool["spec"], "targetPorts": [{"number": 8000}] * 2}}
    no_port = {**pool, "spec": {**pool["spec"], "endpointPickerRef": {"name": "epp"}}}
    assert cel_errors(with_defaults(twice, SCHEMA), SCHEMA) == [
        ".spec.targetPorts: port number must be unique"
    ]
    assert cel_errors(with_defaults(no_port, SCHEMA), SCHEMA) == [
        ".spec.endpointPickerRef: port is required when kind is 'Service' or unspecified "
        "(defaults to 'Service')"
    ]


def test_the_pool_selects_the_main_tracks_engine_pods_and_no_others():
    pool = manifests()["InferencePool"]
    assert pool["metadata"]["namespace"] == OWNER["metadata"]["namespace"]
    spec = defaulted_spec({"canary": {"version": "v2", "weight": 10}})
    match = pool["spec"]["selector"]["matchLabels"]
    assert selects(match, pod(spec)["metadata"]["labels"])
    # A canary serves its own model id: a pool of its own.
    assert not selects(match, pod(spec, "canary")["metadata"]["labels"])
    # Exactly the Deployment's own selector, so the pool follows it through rollouts.
    deployment = resources.deployment(OWNER, spec, "maas:1", 1)
    assert match == deployment["spec"]["selector"]["matchLabels"]


def test_the_target_port_is_where_the_pods_engine_serves_http(monkeypatch):
    [target] = manifests()["InferencePool"]["spec"]["targetPorts"]
    [engine] = pod(defaulted_spec({}))["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in engine["ports"]}
    assert ports["http"] == target["number"]
    # The engine in that container reads its HTTP port from the environment it is given.
    for env in engine["env"]:
        if "value" in env:
            monkeypatch.setenv(env["name"], env["value"])
    assert EngineSettings().http_port == target["number"]


def test_a_vllm_pods_server_answers_on_the_same_port():
    spec = defaulted_spec(
        {"engine": {"backend": "vllm"}, "resources": {"gpus": 1}},
    )
    containers = pod(spec)["spec"]["containers"]
    [target] = manifests()["InferencePool"]["spec"]["targetPorts"]
    served = {p["containerPort"]: c["name"] for c in containers for p in c["ports"]}
    # vLLM's own server speaks the protocol there; the adapter opens no front of its own.
    assert served[target["number"]] != "engine"
    adapter = containers[0]
    assert "MAAS_HTTP_PORT" not in {env["name"] for env in adapter["env"]}


def test_the_route_sends_to_the_pool_with_the_token():
    docs = manifests()
    [rule] = docs["HTTPRoute"]["spec"]["rules"]
    [backend] = rule["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io",
        "InferencePool",
        docs["InferencePool"]["metadata"]["name"],
    )
    [header] = rule["filters"][0]["requestHeaderModifier"]["set"]
    assert header["name"] == "Authorization" and header["value"].startswith("Bearer ")


@pytest.mark.parametrize("track", ["main", "canary"])
def test_the_network_policy_opens_the_http_port_on_engine_pods(track):
    policy = manifests()["NetworkPolicy"]
    kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)
    spec = defaulted_spec({"canary": {"version": "v2", "weight": 10}})
    assert selects(
        policy["spec"]["podSelector"]["matchLabels"], pod(spec, track)["metadata"]["labels"]
    )
    [target] = manifests()["InferencePool"]["spec"]["targetPorts"]
    [rule] = policy["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == [target["number"]]
