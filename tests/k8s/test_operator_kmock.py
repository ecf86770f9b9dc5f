"""The real kopf operator against kmock's Kubernetes emulator over HTTP.

Handlers, reconcile and the autoscaler run unchanged; only the API server
(kmock), the router and the engines (fake gRPC servers) and the kubelet
(FakePool.sync) are stand-ins.
"""

import asyncio
import contextlib
import threading
import time

import kmock
import kopf
import pytest

from maas_operator.modeldeployment.admission import AdmissionPolicy
from maas_operator.modeldeployment.autoscale import Dependencies
from maas_operator.modeldeployment.grpc_clients import RouterClient, drain_engine
from maas_operator.modeldeployment.handlers import FINALIZER, OperatorContext, build_registry
from maas_operator.modeldeployment.kube import Credentials, KubeApi
from maas_operator.modeldeployment.resources import DELETION_COST
from tests.k8s.apply_emulator import ApplyingEmulator
from tests.k8s.chart_render import rendered
from tests.k8s.fake_pool import FakePool
from tests.k8s.rbac import Grants, calls_by
from tests.k8s.written_objects import check_writes

NAMESPACE = "maas-test"
MDS = "maas.io/v1alpha1/modeldeployments"
OWNED = [
    ("apps/v1/deployments", "demo-engine"),
    ("v1/services", "demo-engine"),
    ("policy/v1/poddisruptionbudgets", "demo-engine"),
]
TICK = 0.2
# The operator's calls are told from the fakes' and the test's by this token.
OPERATOR_TOKEN = "operator-token"
ADMISSION = AdmissionPolicy(
    allowed_images=("maas:*", "registry.example.com/fetch/*"),
    credentials_secret_pattern="model-credentials-[a-z0-9-]+",
)

pytestmark = pytest.mark.timeout(120)


def model_deployment(**spec) -> dict:
    return {
        "apiVersion": "maas.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "demo", "namespace": NAMESPACE},
        "spec": {
            "model": {"name": "demo-model"},
            "replicas": {"min": 1, "max": 4},
            "autoscaling": {
                "queueCapacityPerReplica": 10,
                "scaleInWatermark": 0.3,
                "stabilizationSeconds": 1,
                "cooldownSeconds": 1,
                "drainTimeoutSeconds": 60,
            },
            **spec,
        },
    }


async def eventually(check, timeout: float = 60.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.05)


def live(emulator, resource: str, name: str):
    key = (kmock.resource(resource), NAMESPACE, name)
    if key not in emulator.objects or emulator.objects[key].deleted:
        return None
    return emulator.objects[key].raw


def events(emulator) -> list[dict]:
    return [
        obj.raw
        for (resource, _, _), obj in emulator.objects.items()
        if resource.plural == "events" and not obj.deleted
    ]


def reasons(emulator) -> list[str]:
    return [e.get("reason") for e in events(emulator)]


async def _operator(
    url: str, router_address: str, stop: threading.Event, ready: threading.Event, routes=None
):
    router = RouterClient(router_address)
    api = KubeApi(Credentials(server=url, token=OPERATOR_TOKEN))
    ctx = OperatorContext(
        deps=Dependencies(api=api, pool_stats=router.pool_stats, drain_engine=drain_engine),
        engine_image="maas:test",
        interval_seconds=TICK,
        admission=ADMISSION,
        login=lambda **_: kopf.ConnectionInfo(server=url, token=OPERATOR_TOKEN),
        routes=routes,
    )
    registry = build_registry(ctx)

    # kmock cannot parse the namespace list kopf scans in a namespaced run, so the
    # namespace is named as existing (kopf's fallback without the right to list).
    @kopf.on.startup(registry=registry)
    def no_namespace_scan(settings: kopf.OperatorSettings, **_):
        settings.scanning.disabled = True

    try:
        await kopf.operator(
            registry=registry,
            standalone=True,
            namespaces=[NAMESPACE],
            stop_flag=stop,
            ready_flag=ready,
        )
    finally:
        await router.close()
        await api.close()


@contextlib.asynccontextmanager
async def emulated_api():
    """kmock over HTTP, with server-side apply, serving ModelDeployments too."""
    async with ApplyingEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.resources.load_bundled()
        emulator.resources[MDS] = kmock.ResourceInfo(
            kind="ModelDeployment",
            singular="modeldeployment",
            namespaced=True,
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
            subresources={"status", "scale"},
        )
        yield emulator, server


@contextlib.asynccontextmanager
async def operator_running(url: str, router_address: str, routes=None):
    """The operator in a thread with its own event loop, as in production:
    when kopf stops it cancels every task of its loop that it did not start
    with, which in a shared loop would be the fakes' servers. Waits happen
    off this loop, which serves the emulator."""
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=asyncio.run,
        args=(_operator(url, router_address, stop, ready, routes),),
        daemon=True,
    )
    thread.start()
    try:
        assert await asyncio.to_thread(ready.wait, 20), "the operator did not start"
        yield
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 20)


@contextlib.asynccontextmanager
async def running_cluster(routes=None):
    """kmock over HTTP, a fake router + kubelet, and the operator running on them."""
    async with emulated_api() as (emulator, server):
        pool = FakePool(emulator, NAMESPACE, "demo", "demo-model")
        await pool.start()
        kubelet = asyncio.create_task(pool.run())
        try:
            async with operator_running(str(server.url), pool.router_address, routes):
                yield emulator, server.client, pool
        finally:
            kubelet.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await kubelet
            await pool.stop()
        # Reached only when the test passed: what a real API server would have refused.
        check_operator_calls(emulator)


def check_operator_calls(emulator) -> None:
    """Every call within the chart's RBAC for the operator in its release namespace,
    and every object it wrote valid for the API server's schemas."""
    grants = Grants.of(rendered(NAMESPACE), "maas-operator", NAMESPACE)
    calls, other = calls_by(emulator, OPERATOR_TOKEN)
    assert calls and not other, other
    assert grants.refused(calls) == []
    problems, unchecked = check_writes(emulator, OPERATOR_TOKEN)
    assert problems == []
    assert unchecked <= {"pods"}, "the fake kubelet's pods are only annotated by the operator"


async def create(client, body: dict) -> None:
    response = await client.post(
        f"/apis/maas.io/v1alpha1/namespaces/{NAMESPACE}/modeldeployments", json=body
    )
    assert response.status == 200, await response.text()


async def patch(client, body: dict) -> None:
    response = await client.patch(
        f"/apis/maas.io/v1alpha1/namespaces/{NAMESPACE}/modeldeployments/demo",
        json=body,
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200, await response.text()


def md(emulator) -> dict:
    return live(emulator, MDS, "demo")


def replicas_asked(emulator) -> int:
    return live(emulator, "apps/v1/deployments", "demo-engine")["spec"]["replicas"]


async def test_create_owns_objects_patch_rolls_out_delete_cleans_up():
    async with running_cluster() as (emulator, client, pool):
        await _create_patch_delete(emulator, client, pool)


async def _create_patch_delete(emulator, client, pool):
    await create(client, model_deployment())
    owned = await eventually(
        lambda: (
            all(live(emulator, r, n) for r, n in OWNED) and [live(emulator, r, n) for r, n in OWNED]
        ),
        what="Deployment, Service and PDB",
    )
    uid = md(emulator)["metadata"]["uid"]
    for obj in owned:
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == uid and ref["kind"] == "ModelDeployment" and ref["controller"]
    deployment = owned[0]
    assert deployment["spec"]["replicas"] == 1
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--max-num-seqs=64" in args and "--model-id=demo-model" in args
    assert FINALIZER in md(emulator)["metadata"]["finalizers"]

    await patch(
        client,
        {"spec": {"engine": {"maxNumSeqs": 8}, "resources": {"nodeSelector": {"gpu": "h200"}}}},
    )

    def rolled_out():
        template = live(emulator, "apps/v1/deployments", "demo-engine")["spec"]["template"]
        return "--max-num-seqs=8" in template["spec"]["containers"][0]["args"] and template

    template = await eventually(rolled_out, what="the new pod template")
    assert template["spec"]["nodeSelector"] == {"gpu": "h200"}
    assert replicas_asked(emulator) == 1, "a spec change must not reset the autoscaler's count"
    await eventually(lambda: reasons(emulator).count("Reconciled") >= 2, what="Reconciled events")

    response = await client.delete(
        f"/apis/maas.io/v1alpha1/namespaces/{NAMESPACE}/modeldeployments/demo"
    )
    assert response.status == 200
    await eventually(lambda: md(emulator) is None, what="the finalizer to be released")
    assert not any(live(emulator, r, n) for r, n in OWNED)


async def test_watermarks_scale_out_and_drain_before_scale_in():
    async with running_cluster() as (emulator, client, pool):
        await _scale_out_and_in(emulator, client, pool)


async def _scale_out_and_in(emulator, client, pool):
    pool.queue_depth = 0
    await create(client, model_deployment())
    await eventually(
        lambda: len(pool.replicas) == 1 and all(r.ready for r in pool.replicas.values())
    )

    # 6 waiting on one replica of capacity 10 is 60%: pre-warm exactly one.
    pool.hold_starting = True
    pool.queue_depth = 6
    await eventually(lambda: replicas_asked(emulator) == 2, what="pre-warm to 2")
    await eventually(lambda: "Prewarm" in reasons(emulator), what="a Prewarm Event")
    # While it loads, the starting replica counts as capacity: no further scale-out
    # even after the cooldown has passed.
    await asyncio.sleep(1.5)
    assert replicas_asked(emulator) == 2
    pool.hold_starting = False

    # 30 waiting on two replicas is 150%: at once to the count that brings it under
    # 60% (floor(30/6)+1 = 6), capped by max 4, which the status reports.
    await eventually(lambda: md(emulator).get("status", {}).get("readyReplicas") == 2)
    pool.queue_depth = 30
    await eventually(lambda: replicas_asked(emulator) == 4, what="scale-out to max")
    status = await eventually(
        lambda: md(emulator)["status"].get("readyReplicas") == 4 and md(emulator)["status"]
    )
    limited = {c["type"]: c for c in status["conditions"]}["ScalingLimited"]
    assert limited["status"] == "True" and limited["reason"] == "AtMaxReplicas"
    await eventually(lambda: "ScaleOut" in reasons(emulator), what="a ScaleOut Event")

    # Quiet: after the stabilisation window one replica drains. It keeps its
    # pod while a request is still running on it.
    for replica in pool.replicas.values():
        replica.running = 1
    pool.queue_depth = 0
    idle = next(iter(pool.replicas.values()))
    idle.running = 0
    await eventually(lambda: idle.drain_calls == 1, what="Drain on the idle replica")
    victim = idle.pod
    await eventually(lambda: pool.removed == [victim], what="exactly the drained pod removed")
    assert replicas_asked(emulator) == 3
    assert all(r.drain_calls == 0 for r in pool.replicas.values()), "only one replica drained"
    await eventually(lambda: {"DrainStarted", "ScaledIn"} <= set(reasons(emulator)))

    # The next drain waits for a busy replica to finish its request.
    await eventually(lambda: sum(r.drain_calls for r in pool.replicas.values()) == 1)
    (busy,) = [r for r in pool.replicas.values() if r.drain_calls]
    pod = live(emulator, "v1/pods", busy.pod)
    assert pod["metadata"]["annotations"][DELETION_COST] == "-1000000"
    await asyncio.sleep(1.0)
    assert busy.pod in pool.replicas and replicas_asked(emulator) == 3
    busy.running = 0
    await eventually(lambda: pool.removed[-1:] == [busy.pod], what="the second drained pod removed")
    assert replicas_asked(emulator) == 2


def condition(emulator, kind: str) -> dict | None:
    found = [
        c for c in (md(emulator).get("status") or {}).get("conditions", []) if c["type"] == kind
    ]
    return found[0] if found else None


async def test_disallowed_images_and_secrets_are_refused_and_create_nothing():
    async with running_cluster() as (emulator, client, pool):
        await _refused_then_admitted(emulator, client)


async def _refused_then_admitted(emulator, client):
    await create(client, model_deployment(image="attacker.example/miner:latest"))
    ready = await eventually(
        lambda: (c := condition(emulator, "Ready")) and c["status"] == "False" and c,
        what="Ready=False",
    )
    assert ready["reason"] == "ImageNotAllowed" and "spec.image" in ready["message"]
    assert ready["observedGeneration"] == md(emulator)["metadata"]["generation"]
    # kopf posts the Event in the background, after the status patch.
    (event,) = await eventually(
        lambda: [e for e in events(emulator) if e.get("reason") == "ImageNotAllowed"],
        what="the ImageNotAllowed Event",
    )
    assert event["type"] == "Warning" and "attacker.example/miner:latest" in event["message"]
    # The handler returned before creating anything: no owned object exists, ever.
    assert not any(live(emulator, r, n) for r, n in OWNED)

    source = {
        "uri": "s3://bucket/models/demo/",
        "fetchImage": "registry.example.com/fetch/aws:2",
        "credentialsSecret": "maas-redis-password",
    }
    await patch(client, {"spec": {"image": None, "model": {"source": source}}})
    await eventually(
        lambda: condition(emulator, "Ready")["reason"] == "SecretNotAllowed",
        what="SecretNotAllowed",
    )
    assert "maas-redis-password" in condition(emulator, "Ready")["message"]
    assert "SecretNotAllowed" in reasons(emulator)
    assert not any(live(emulator, r, n) for r, n in OWNED)

    await patch(
        client,
        {
            "spec": {
                "model": {"source": {"credentialsSecret": "model-credentials-demo"}},
                "canary": {"version": "v2", "weight": 10, "image": "maas:v2"},
            }
        },
    )
    # The Event comes once every object is applied; Ready only says the main replicas serve.
    await eventually(
        lambda: any(
            "Deployment/demo-engine-canary created" in e.get("message", "")
            for e in events(emulator)
            if e.get("reason") == "Reconciled"
        ),
        what="the objects created",
    )
    await eventually(lambda: condition(emulator, "Ready")["status"] == "True", what="Ready=True")
    assert condition(emulator, "Ready")["reason"] == "MinimumReplicasReady"
    deployment = live(emulator, "apps/v1/deployments", "demo-engine")
    (fetch,) = deployment["spec"]["template"]["spec"]["initContainers"]
    assert fetch["image"] == "registry.example.com/fetch/aws:2"
    assert fetch["envFrom"] == [{"secretRef": {"name": "model-credentials-demo"}}]
    canary = live(emulator, "apps/v1/deployments", "demo-engine-canary")
    assert canary["spec"]["template"]["spec"]["containers"][0]["image"] == "maas:v2"

    # A running deployment whose spec turns disallowed keeps what it runs, and
    # the autoscaler, which rewrites the conditions every tick, keeps it not Ready.
    await patch(client, {"spec": {"canary": {"image": "attacker.example/miner:1"}}})
    generation = md(emulator)["metadata"]["generation"]
    await eventually(
        lambda: (c := condition(emulator, "Available")) and c["observedGeneration"] == generation,
        what="an autoscaler tick on the new spec",
    )
    assert condition(emulator, "Ready")["reason"] == "ImageNotAllowed"
    assert "spec.canary.image" in condition(emulator, "Ready")["message"]
    canary = live(emulator, "apps/v1/deployments", "demo-engine-canary")
    assert canary["spec"]["template"]["spec"]["containers"][0]["image"] == "maas:v2"
