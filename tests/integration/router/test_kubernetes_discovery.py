"""Kubernetes discovery against kmock's emulated API server, over real HTTP.

The Services and EndpointSlices are what the operator and the EndpointSlice
controller would create, each engine Service owned by its ModelDeployment; the
engines behind them are fake gRPC servers. The router's calls are checked
against the RBAC the chart gives it.
"""

import asyncio

import pytest
from kubernetes import client
from lightkube.core.selector import build_selector

from maas_services.common.grpc_client import open_channel
from maas_services.router.discovery.kubernetes import label_selector
from tests.integration.router.conftest import Router, eventually
from tests.integration.router.fake_engine import FakeEngine
from tests.k8s.chart_render import rendered
from tests.k8s.kubeconfig import write_kubeconfig
from tests.k8s.rbac import Grants, calls_by
from tests.k8s.test_operator_kmock import emulated_api

NAMESPACE = "maas-test"
# A second namespace the operator manages (operator.watchNamespaces).
OTHER = "team-a"
ROUTER_TOKEN = "router-token"
MD = ("maas.io", "v1alpha1")
pytestmark = pytest.mark.timeout(60)


def owner_reference(deployment: dict) -> dict:
    """What the operator puts on every object it makes (operators/modeldeployment/resources.py)."""
    meta = deployment["metadata"]
    return {
        "apiVersion": "maas.io/v1alpha1",
        "kind": "ModelDeployment",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def engine_service(
    policy: str,
    namespace: str = NAMESPACE,
    model: str = "m",
    owner: dict | None = None,
    name: str = "demo-engine",
) -> dict:
    meta = {
        "name": name,
        "namespace": namespace,
        "labels": {"app.kubernetes.io/name": "maas-engine", "maas.io/model": model},
        "annotations": {
            "maas.io/routing-policy": policy,
            "maas.io/routing-weights": "{}",
        },
    }
    if owner is not None:
        meta["ownerReferences"] = [owner_reference(owner)]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {"clusterIP": "None", "ports": [{"name": "grpc", "port": 50051}]},
    }


def endpoint_slice(
    name: str,
    pod: str,
    port: int,
    ready=True,
    terminating=False,
    namespace: str = NAMESPACE,
    service: str = "demo-engine",
) -> dict:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service},
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
    """kmock over HTTP (serving ModelDeployments), and a kubeconfig pointing the router at it."""
    async with emulated_api() as (emulator, server):
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


async def model_deployment(api, name: str, model: str, namespace: str = NAMESPACE) -> dict:
    """A ModelDeployment as created (the emulator stamps uid and creationTimestamp)."""
    body = {
        "apiVersion": "maas.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"model": {"name": model}},
    }
    custom = client.CustomObjectsApi(api)
    await call(custom.create_namespaced_custom_object, *MD, namespace, "modeldeployments", body)
    return await call(custom.get_namespaced_custom_object, *MD, namespace, "modeldeployments", name)


async def test_router_follows_services_and_endpoint_slices(api_server, cluster):
    # api_server first, so the router (in cluster) stops before the API server does.
    kubeconfig, api, emulator = api_server
    core, discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    e0, e1 = await cluster.engine("e0"), await cluster.engine("e1")
    demo = await model_deployment(api, "demo", "m")
    await call(core.create_namespaced_service, NAMESPACE, engine_service("least-load", owner=demo))
    for engine in (e0, e1):
        body = endpoint_slice(
            f"demo-engine-{engine.engine_id}", f"pod-{engine.engine_id}", engine.port
        )
        await call(discovery.create_namespaced_endpoint_slice, NAMESPACE, body)

    # The same Service name in another managed namespace: its slices join that one.
    e2 = await cluster.engine("e2", model="m2")
    other = await model_deployment(api, "demo", "m2", OTHER)
    await call(
        core.create_namespaced_service, OTHER, engine_service("least-load", OTHER, "m2", other)
    )
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
        core.patch_namespaced_service,
        "demo-engine",
        NAMESPACE,
        engine_service("round_robin", owner=demo),
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
        owner = await model_deployment(api, "demo", model, namespace)
        service = engine_service("", namespace, model, owner)
        await call(core.create_namespaced_service, namespace, service)
        body = endpoint_slice("demo-engine-a", f"pod-{namespace}", engine.port, namespace=namespace)
        await call(discovery.create_namespaced_endpoint_slice, namespace, body)

    router: Router = await cluster.router(
        discovery="kubernetes", kubeconfig=str(kubeconfig), kubernetes_namespaces=[], engines=[]
    )
    await eventually(lambda: {"pod-maas-test", "pod-team-a"} <= set(router.pool.endpoints))
    assert {e.model for e in router.pool.endpoints.values()} == {"m", "m2"}
    assert_within_chart_rbac(emulator, "operator.clusterWide=true")


async def test_a_slice_deleted_while_the_watch_expires_is_dropped_by_the_relist(
    api_server, cluster
):
    kubeconfig, api, emulator = api_server
    core, discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    e0, e1 = await cluster.engine("e0"), await cluster.engine("e1")
    demo = await model_deployment(api, "demo", "m")
    await call(core.create_namespaced_service, NAMESPACE, engine_service("", owner=demo))
    for engine in (e0, e1):
        body = endpoint_slice(f"s-{engine.engine_id}", f"pod-{engine.engine_id}", engine.port)
        await call(discovery.create_namespaced_endpoint_slice, NAMESPACE, body)
    router: Router = await cluster.router(
        discovery="kubernetes", kubeconfig=str(kubeconfig), kubernetes_namespaces=[NAMESPACE]
    )
    await eventually(lambda: {"pod-e0", "pod-e1"} <= set(router.pool.endpoints))
    # Every watch ends with 410 Gone in place of the DELETED event it would carry.
    emulator.expire_watches()
    await call(discovery.delete_namespaced_endpoint_slice, "s-e0", NAMESPACE)
    await eventually(lambda: "pod-e0" not in router.pool.endpoints, what="e0 dropped")
    assert "pod-e1" in router.pool.endpoints
    assert_within_chart_rbac(emulator)


class CountingEngine(FakeEngine):
    """A fake engine that remembers every call it got and the metadata it came with."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[dict] = []

    async def GetLoad(self, request, context):
        self.calls.append(dict(context.invocation_metadata()))
        return await super().GetLoad(request, context)

    async def StreamKvEvents(self, request, context):
        self.calls.append(dict(context.invocation_metadata()))
        async for batch in super().StreamKvEvents(request, context):
            yield batch


async def test_only_engines_a_model_deployment_of_that_model_owns_are_pooled(
    api_server, cluster, monkeypatch
):
    kubeconfig, api, emulator = api_server
    core, discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    monkeypatch.setenv("MAAS_SERVICE_TOKEN", "the-release-token")
    engines = {}
    for engine_id in ("trusted", "unowned", "foreign", "late"):
        engine = CountingEngine(engine_id, model="m")
        engines[engine_id] = await engine.start()
        cluster.engines.append(engine)

    async def publish(service: dict, engine_id: str) -> None:
        name = service["metadata"]["name"]
        port = engines[engine_id].port
        body = endpoint_slice(f"{name}-x", f"pod-{engine_id}", port, service=name)
        await call(core.create_namespaced_service, NAMESPACE, service)
        await call(discovery.create_namespaced_endpoint_slice, NAMESPACE, body)

    first = await model_deployment(api, "first", "m")
    other_model = await model_deployment(api, "other", "m2")
    # Made later (or in the same second, and "late" sorts after "first") and claiming
    # the same model id: a condition on it, never a shared pool.
    late = await model_deployment(api, "late", "m")
    services = [
        (engine_service("", owner=first, name="first-engine"), "trusted"),
        # Labelled as an engine of m by someone who may create Services, owned by nothing.
        (engine_service("", name="rogue-engine"), "unowned"),
        # Owned, but by a ModelDeployment of another model.
        (engine_service("", owner=other_model, name="other-engine"), "foreign"),
        (engine_service("", owner=late, name="late-engine"), "late"),
    ]
    for service, engine_id in services:
        await publish(service, engine_id)

    router: Router = await cluster.router(
        discovery="kubernetes", kubeconfig=str(kubeconfig), kubernetes_namespaces=[NAMESPACE]
    )
    await eventually(lambda: router.pool.endpoints.get("pod-trusted") is not None)
    assert set(router.pool.endpoints) == {"pod-trusted"}
    # The router now demands the token too: pick through a channel that carries it.
    await router.channel.close()
    router.channel = open_channel(f"127.0.0.1:{router.handle.port}", "test")
    assert {await router.pick(list(range(40 + i))) for i in range(8)} == {"pod-trusted"}
    assert engines["trusted"].calls[0]["maas-service-token"] == "the-release-token"
    for engine_id in ("unowned", "foreign", "late"):
        assert engines[engine_id].calls == [], f"{engine_id} was called"

    # The earlier claimant goes: the later one's engines are now the model's.
    custom = client.CustomObjectsApi(api)
    await call(custom.delete_namespaced_custom_object, *MD, NAMESPACE, "modeldeployments", "first")
    await eventually(lambda: set(router.pool.endpoints) == {"pod-late"}, what="late pooled")
    assert engines["unowned"].calls == [] and engines["foreign"].calls == []
    assert_within_chart_rbac(emulator)


def test_the_service_selector_reaches_lightkube_as_the_api_reads_it():
    labels = label_selector("app.kubernetes.io/name=maas-engine, tier!=canary,maas.io/model,!old")
    assert build_selector(labels) == (
        "app.kubernetes.io/name=maas-engine,tier!=canary,maas.io/model,!old"
    )
    assert label_selector("") is None
