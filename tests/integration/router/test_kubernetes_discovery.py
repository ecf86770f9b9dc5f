"""Kubernetes discovery against kmock's emulated API server, over real HTTP.

The Services and EndpointSlices are what the operator and the EndpointSlice
controller would create; the engines behind them are fake gRPC servers. The
router's calls are checked against the RBAC the chart gives it.
"""

import asyncio

import kmock
import pytest
from kubernetes import client

from tests.integration.router.conftest import Router, eventually
from tests.k8s.chart_render import rendered
from tests.k8s.kubeconfig import write_kubeconfig
from tests.k8s.rbac import Grants, calls_by

NAMESPACE = "maas-test"
# A second namespace the operator manages (operator.watchNamespaces).
OTHER = "team-a"
ROUTER_TOKEN = "router-token"
pytestmark = pytest.mark.timeout(60)


def engine_service(policy: str, namespace: str = NAMESPACE, model: str = "m") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "demo-engine",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "maas-engine", "maas.io/model": model},
            "annotations": {
                "maas.io/routing-policy": policy,
                "maas.io/routing-weights": "{}",
            },
        },
        "spec": {"clusterIP": "None", "ports": [{"name": "grpc", "port": 50051}]},
    }


def endpoint_slice(
    name: str, pod: str, port: int, ready=True, terminating=False, namespace: str = NAMESPACE
) -> dict:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": "demo-engine"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "grpc", "port": port, "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": ["127.0.0.1"],
                "conditions": {"ready": ready, "serving": True, "terminating": terminating},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": namespace},
            }
        ],
    }


@pytest.fixture
async def api_server(tmp_path, monkeypatch):
    """kmock over HTTP, and a kubeconfig pointing the router's client at it."""
    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.resources.load_bundled()
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url, ROUTER_TOKEN, NAMESPACE)
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield kubeconfig, client.ApiClient(client.Configuration(host=str(server.url))), emulator


def assert_within_chart_rbac(emulator, *chart_settings: str) -> None:
    """Nothing the router called would a real API server have refused it."""
    docs = rendered(NAMESPACE, *chart_settings)
    calls, other = calls_by(emulator, ROUTER_TOKEN)
    assert calls and not other, other
    assert Grants.of(docs, "maas-router", NAMESPACE).refused(calls) == []


async def call(method, *args):
    # The client blocks, and the emulator serves from this very event loop.
    return await asyncio.to_thread(method, *args)


async def test_router_follows_services_and_endpoint_slices(api_server, cluster):
    # api_server first, so the router (in cluster) stops before the API server does.
    kubeconfig, api, emulator = api_server
    core, discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    e0, e1 = await cluster.engine("e0"), await cluster.engine("e1")
    await call(core.create_namespaced_service, NAMESPACE, engine_service("least-load"))
    for engine in (e0, e1):
        body = endpoint_slice(
            f"demo-engine-{engine.engine_id}", f"pod-{engine.engine_id}", engine.port
        )
        await call(discovery.create_namespaced_endpoint_slice, NAMESPACE, body)

    # The same Service name in another managed namespace: its slices join that one.
    e2 = await cluster.engine("e2", model="m2")
    await call(core.create_namespaced_service, OTHER, engine_service("least-load", OTHER, "m2"))
    body = endpoint_slice("demo-engine-e2", "pod-e2", e2.port, namespace=OTHER)
    await call(discovery.create_namespaced_endpoint_slice, OTHER, body)

    router: Router = await cluster.router(
        discovery="kubernetes",
        kubeconfig=str(kubeconfig),
        kubernetes_namespaces=[NAMESPACE, OTHER],
        engines=[],
    )
    stats = await router.stats()
    assert [r.endpoint_id for r in stats.replicas] == ["pod-e0", "pod-e1"]
    assert stats.routing_policy == "least_load"
    await eventually(lambda: len([e for e in router.pool.endpoints.values() if e.available]) == 3)
    assert router.pool.endpoints["pod-e2"].model == "m2"

    # The pod behind e0 is being deleted: it finishes its requests but gets no new ones.
    await call(
        discovery.patch_namespaced_endpoint_slice,
        "demo-engine-e0",
        NAMESPACE,
        endpoint_slice("demo-engine-e0", "pod-e0", e0.port, ready=False, terminating=True),
    )
    await eventually(lambda: router.pool.endpoints["pod-e0"].terminating, what="e0 terminating")
    assert {await router.pick(list(range(40 + i))) for i in range(6)} == {"pod-e1"}

    await call(discovery.delete_namespaced_endpoint_slice, "demo-engine-e0", NAMESPACE)
    await eventually(lambda: "pod-e0" not in router.pool.endpoints, what="e0 removed")

    await call(
        core.patch_namespaced_service, "demo-engine", NAMESPACE, engine_service("round_robin")
    )
    await eventually(lambda: router.pool.routing["m"].policy == "round_robin", what="policy change")
    assert (await router.stats()).routing_policy == "round_robin"
    assert_within_chart_rbac(emulator, f"operator.watchNamespaces={{{OTHER}}}")


async def test_cluster_wide_router_finds_engines_in_every_namespace(api_server, cluster):
    kubeconfig, api, emulator = api_server
    core, discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    engines = {}
    for namespace, model in ((NAMESPACE, "m"), (OTHER, "m2")):
        engine = engines[namespace] = await cluster.engine(f"e-{namespace}", model=model)
        await call(core.create_namespaced_service, namespace, engine_service("", namespace, model))
        body = endpoint_slice("demo-engine-a", f"pod-{namespace}", engine.port, namespace=namespace)
        await call(discovery.create_namespaced_endpoint_slice, namespace, body)

    router: Router = await cluster.router(
        discovery="kubernetes", kubeconfig=str(kubeconfig), kubernetes_namespaces=[], engines=[]
    )
    await eventually(lambda: {"pod-maas-test", "pod-team-a"} <= set(router.pool.endpoints))
    assert {e.model for e in router.pool.endpoints.values()} == {"m", "m2"}
    assert_within_chart_rbac(emulator, "operator.clusterWide=true")
