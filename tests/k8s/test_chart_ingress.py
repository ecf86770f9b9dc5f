"""The gateway's HTTP front exposed by an Ingress or a Gateway API HTTPRoute, both
off by default. The Ingress goes through kubernetes-validate; the HTTPRoute through
Gateway API's own schema (tests/k8s/schemas/httproute-v1.json, from the v1.6.1
standard CRD), strictly: a field the CRD does not know is an error, as it is for
`kubectl apply` with strict field validation."""

import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest

from tests.k8s.test_chart import (  # noqa: F401 (helm is a fixture)
    KUBERNETES_VERSION,
    helm,
    render_refused,
    render_set,
)

HTTPROUTE_SCHEMA = Path(__file__).parent / "schemas" / "httproute-v1.json"
INGRESS = (
    "gateway.ingress.enabled=true",
    "gateway.ingress.className=nginx",
    "gateway.ingress.hosts={api.example.com,llm.example.com}",
    "gateway.ingress.tlsSecretName=api-tls",
)
HTTPROUTE = (
    "gateway.httpRoute.enabled=true",
    "gateway.httpRoute.parentRefs[0].name=public",
    "gateway.httpRoute.parentRefs[0].namespace=gateways",
    "gateway.httpRoute.parentRefs[0].sectionName=https",
    "gateway.httpRoute.hostnames={api.example.com}",
    "gateway.httpRoute.timeouts.request=0s",
)


def strict(schema):
    """The schema with unknown fields refused wherever it lists the known ones."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    known = "properties" in out and "additionalProperties" not in out
    if known and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def httproute_validator():
    schema = strict(json.loads(HTTPROUTE_SCHEMA.read_text()))
    return jsonschema.Draft7Validator(schema)


def one(docs, kind: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def gateway_http_port(docs) -> tuple[str, int]:
    (service,) = [
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "maas-gateway"
    ]
    (http,) = [p for p in service["spec"]["ports"] if p["name"] == "http"]
    return http["name"], http["port"]


def test_neither_is_rendered_by_default(helm):  # noqa: F811
    kinds = {d["kind"] for d in render_set(helm)}
    assert not {"Ingress", "HTTPRoute"} & kinds


def test_the_ingress_routes_every_host_to_the_gateways_http_port(helm):  # noqa: F811
    docs = render_set(helm, *INGRESS)
    ingress = one(docs, "Ingress")
    kubernetes_validate.validate(ingress, KUBERNETES_VERSION, strict=True)
    spec = ingress["spec"]
    assert spec["ingressClassName"] == "nginx"
    assert spec["tls"] == [
        {"secretName": "api-tls", "hosts": ["api.example.com", "llm.example.com"]}
    ]
    port_name, _ = gateway_http_port(docs)
    assert [rule["host"] for rule in spec["rules"]] == ["api.example.com", "llm.example.com"]
    for rule in spec["rules"]:
        (path,) = rule["http"]["paths"]
        assert (path["path"], path["pathType"]) == ("/", "Prefix")
        assert path["backend"]["service"] == {"name": "maas-gateway", "port": {"name": port_name}}


def test_the_ingress_streams_by_default_and_takes_more_annotations(helm):  # noqa: F811
    docs = render_set(helm, *INGRESS, "gateway.ingress.annotations.team=llm")
    annotations = one(docs, "Ingress")["metadata"]["annotations"]
    # SSE: no response buffering, quiet streams kept open, bodies up to maxBodyBytes.
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 3600
    assert annotations["nginx.ingress.kubernetes.io/proxy-body-size"] == "4m"
    assert annotations["team"] == "llm"
    # Without a TLS Secret, plain HTTP.
    plain = render_set(helm, "gateway.ingress.enabled=true", "gateway.ingress.hosts={a.example}")
    assert "tls" not in one(plain, "Ingress")["spec"]


def test_the_httproute_attaches_to_the_named_gateway(helm, httproute_validator):  # noqa: F811
    docs = render_set(helm, *HTTPROUTE)
    route = one(docs, "HTTPRoute")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    errors = [e.message for e in httproute_validator.iter_errors(route)]
    assert errors == []
    spec = route["spec"]
    assert spec["parentRefs"] == [
        {"name": "public", "namespace": "gateways", "sectionName": "https"}
    ]
    assert spec["hostnames"] == ["api.example.com"]
    (rule,) = spec["rules"]
    _, port = gateway_http_port(docs)
    assert rule["backendRefs"] == [{"name": "maas-gateway", "port": port}]
    assert rule["timeouts"] == {"request": "0s"}


def test_the_strict_schema_catches_a_misplaced_field(httproute_validator):
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "x"},
        "spec": {"rules": [{"backendRefs": [{"name": "x", "port": 80}], "timeout": "0s"}]},
    }
    assert list(httproute_validator.iter_errors(route))


def test_enabled_without_a_host_or_a_parent_is_refused(helm):  # noqa: F811
    assert "gateway.ingress.hosts" in render_refused(helm, "gateway.ingress.enabled=true")
    assert "gateway.httpRoute.parentRefs" in render_refused(helm, "gateway.httpRoute.enabled=true")
