"""The chart starts the router on Kubernetes discovery over the operator's namespaces,
with rights to read engine Services, EndpointSlices and the ModelDeployments that
own them there, and nothing else."""

import json

from maas_services.router.settings import RouterSettings
from tests.k8s.chart_render import rendered
from tests.k8s.rbac import Call, Grants


def _env(docs, name: str) -> dict[str, str]:
    (workload,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == name]
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"] if "value" in e}


def _router_settings(docs) -> RouterSettings:
    env = _env(docs, "maas-router")
    return RouterSettings(
        discovery=env["MAAS_DISCOVERY"],
        kubernetes_namespaces=json.loads(env["MAAS_KUBERNETES_NAMESPACES"]),
    )


def _reads(namespace: str | None) -> list[Call]:
    return [
        Call(verb, group, resource, namespace, None)
        for verb in ("list", "watch")
        for group, resource in (
            ("", "services"),
            ("discovery.k8s.io", "endpointslices"),
            ("maas.io", "modeldeployments"),
        )
    ]


def test_router_discovers_in_exactly_the_operators_namespaces():
    docs = rendered("maas", "operator.watchNamespaces={team-a}")
    settings = _router_settings(docs)
    assert settings.discovery == "kubernetes"
    operator_namespaces = json.loads(_env(docs, "maas-operator")["MAAS_NAMESPACES"])
    assert settings.kubernetes_namespaces == operator_namespaces == ["maas", "team-a"]
    grants = Grants.of(docs, "maas-router", "maas")
    for namespace in ("maas", "team-a"):
        assert grants.refused(set(_reads(namespace))) == []
    assert grants.refused(set(_reads("team-b"))) == [
        str(c) for c in sorted(_reads("team-b"), key=str)
    ]
    assert grants.refused(set(_reads(None))), "no list across every namespace"
    writes = {
        Call("patch", "", "services", "maas", "x"),
        Call("get", "", "pods", "maas", "x"),
        Call("patch", "maas.io", "modeldeployments/status", "maas", "x"),
    }
    assert len(grants.refused(writes)) == 3, "the router reads, and only those three"


def test_cluster_wide_router_watches_every_namespace_with_a_cluster_role():
    docs = rendered("maas", "operator.clusterWide=true")
    assert _router_settings(docs).kubernetes_namespaces == []
    grants = Grants.of(docs, "maas-router", "maas")
    assert grants.refused(set(_reads(None))) == []


def test_static_discovery_gets_no_api_access():
    docs = rendered("maas", "router.discovery=static", "router.engines={e0=10.0.0.1:50051}")
    env = _env(docs, "maas-router")
    assert env["MAAS_DISCOVERY"] == "static"
    assert json.loads(env["MAAS_ENGINES"]) == ["e0=10.0.0.1:50051"]
    (router,) = [d for d in docs if d["kind"] == "Deployment" and "router" in d["metadata"]["name"]]
    assert router["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert Grants.of(docs, "maas-router", "maas") == Grants((), {})
