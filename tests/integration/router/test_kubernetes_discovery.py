"""Kubernetes discovery against kmock's emulated API server, over real HTTP.

The Services and EndpointSlices are what the operator and the EndpointSlice
controller would create; the engines behind them are fake gRPC servers.
"""

import asyncio

import kmock
import pytest
from kubernetes import client

from tests.integration.router.conftest import Router, eventually

NAMESPACE = "maas-test"
pytestmark = pytest.mark.timeout(60)


def engine_service(policy: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "demo-engine",
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": "maas-engine", "maas.io/model": "m"},
            "annotations": {
                "maas.io/routing-policy": policy,
                "maas.io/routing-weights": "{}",
            },
        },
        "spec": {"clusterIP": "None", "ports": [{"name": "grpc", "port": 50051}]},
    }


def endpoint_slice(name: str, pod: str, port: int, ready=True, terminating=False) -> dict:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"kubernetes.io/service-name": "demo-engine"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "grpc", "port": port, "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": ["127.0.0.1"],
                "conditions": {"ready": ready, "serving": True, "terminating": terminating},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": NAMESPACE},
            }
        ],
    }


@pytest.fixture
async def api_server(tmp_path, monkeypatch):
    """kmock over HTTP, and a kubeconfig pointing the router's client at it."""
    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.resources.load_bundled()
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            f"""apiVersion: v1
kind: Config
clusters: [{{name: kmock, cluster: {{server: "{server.url}"}}}}]
users: [{{name: test, user: {{token: test}}}}]
contexts: [{{name: kmock, context: {{cluster: kmock, user: test, namespace: {NAMESPACE}}}}}]
current-context: kmock
"""
        )
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield kubeconfig, client.ApiClient(client.Configuration(host=str(server.url)))


async def call(method, *args):
    # The client blocks, and the emulator serves from this very event loop.
    return await asyncio.to_thread(method, *args)


async def test_router_follows_services_and_endpoint_slices(api_server, cluster):
    # api_server first, so the router (in cluster) stops before the API server does.
    kubeconfig, api = api_server
    core, discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    e0, e1 = await cluster.engine("e0"), await cluster.engine("e1")
    await call(core.create_namespaced_service, NAMESPACE, engine_service("least-load"))
    for engine in (e0, e1):
        body = endpoint_slice(
            f"demo-engine-{engine.engine_id}", f"pod-{engine.engine_id}", engine.port
        )
        await call(discovery.create_namespaced_endpoint_slice, NAMESPACE, body)

    router: Router = await cluster.router(
        discovery="kubernetes",
        kubeconfig=str(kubeconfig),
        kubernetes_namespace=NAMESPACE,
        engines=[],
    )
    stats = await router.stats()
    assert [r.endpoint_id for r in stats.replicas] == ["pod-e0", "pod-e1"]
    assert stats.routing_policy == "least_load"
    await eventually(lambda: len([e for e in router.pool.endpoints.values() if e.available]) == 2)

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
