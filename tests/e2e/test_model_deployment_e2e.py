"""A ModelDeployment drives the data path, end to end (#17).

kmock's emulator is the API server; the real operator (kopf, in a thread),
and real router (Kubernetes discovery), gateway (routes ConfigMap watch) and
engine processes run against it; the stack's tokenizer, Redis and billing do
the rest. The test plays the kubelet and the EndpointSlice controller: when
the operator asks for a replica it registers the engine process as the
Service's endpoint.

create with a canary -> routes ConfigMap -> the gateway's table splits
1,000 picks within 5% -> new weight, new split -> at zero a request is held ->
the operator starts a replica -> served and billed -> idle: drained back to
zero -> the next request is held past the hold limit -> 503 with Retry-After.
"""

import asyncio
import time
from collections import Counter

import httpx
import kmock
import pytest

from maas_operator.modeldeployment.resources import OWNER_LABEL, TRACK_LABEL
from maas_operator.modeldeployment.routes import RoutesConfigMap
from maas_services.billing.ledger import Ledger
from maas_services.common.kube_client import async_client
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_services.common.prices import PriceTable
from maas_services.common.redis_client import open_redis
from maas_services.common.service_token import ENV as SERVICE_TOKEN_ENV
from maas_services.common.usage_event import USAGE_STREAM
from maas_services.gateway.routing.routes_configmap import RoutesConfigMapWatch
from maas_services.gateway.routing.routes_watcher import RoutesWatcher
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready
from tests.e2e.tenants import new_tenant_key
from tests.integration.router.conftest import eventually
from tests.k8s.kubeconfig import write_kubeconfig
from tests.k8s.test_operator_kmock import (
    NAMESPACE,
    check_operator_calls,
    emulated_api,
    live,
    md,
    operator_running,
    reasons,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROUTES = RoutesConfigMap(NAMESPACE, "maas-operator-routes")
CANARY = f"{DEFAULT_MODEL_ID}-canary"
POD = "demo-engine-1"
HOLD_LIMIT_SECONDS = 8
MDS_PATH = f"/apis/maas.io/v1alpha1/namespaces/{NAMESPACE}/modeldeployments"
SLICES_PATH = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"


def model_deployment() -> dict:
    return {
        "apiVersion": "maas.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "demo", "namespace": NAMESPACE},
        "spec": {
            "model": {"name": DEFAULT_MODEL_ID},
            "aliases": ["chat"],
            "replicas": {"min": 0, "max": 1},
            "autoscaling": {"scaleToZeroAfterSeconds": 1, "drainTimeoutSeconds": 30},
            "canary": {"version": "v2", "weight": 10},
        },
    }


class Kubelet:
    """Runs the demo Deployment's one replica as the engine process, as far as the
    API shows: a Pod and a ready endpoint in the Service's EndpointSlice."""

    def __init__(self, emulator, client, engine_port: int):
        self.emulator, self.client, self.engine_port = emulator, client, engine_port
        self.can_start = True  # False: pods never become ready (weights never load)
        self.running = False

    def _slice(self) -> dict:
        return {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "demo-engine-x1",
                "namespace": NAMESPACE,
                "labels": {"kubernetes.io/service-name": "demo-engine"},
            },
            "addressType": "IPv4",
            "ports": [{"name": "grpc", "port": self.engine_port, "protocol": "TCP"}],
            "endpoints": [
                {
                    "addresses": ["127.0.0.1"],
                    "conditions": {"ready": True, "serving": True, "terminating": False},
                    "targetRef": {"kind": "Pod", "name": POD, "namespace": NAMESPACE},
                }
            ],
        }

    async def run(self) -> None:
        while True:
            deployment = live(self.emulator, "apps/v1/deployments", "demo-engine")
            wanted = (deployment or {}).get("spec", {}).get("replicas", 0)
            if wanted and not self.running and self.can_start:
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": POD,
                        "namespace": NAMESPACE,
                        "labels": {OWNER_LABEL: "demo", TRACK_LABEL: "main"},
                    },
                    "status": {"podIP": "127.0.0.1"},
                }
                await self.client.post(f"/api/v1/namespaces/{NAMESPACE}/pods", json=pod)
                await self.client.post(SLICES_PATH, json=self._slice())
                self.running = True
            elif not wanted and self.running:
                await self.client.delete(f"{SLICES_PATH}/demo-engine-x1")
                await self.client.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}")
                self.running = False
            if deployment is not None:
                ready = int(self.running)
                status = {"replicas": ready, "readyReplicas": ready}
                self.emulator.objects[
                    kmock.resource("apps/v1/deployments"), NAMESPACE, "demo-engine"
                ].patch({"status": status})
            await asyncio.sleep(0.05)


def canary_share(watcher: RoutesWatcher) -> float:
    running = {DEFAULT_MODEL_ID, CANARY}
    chosen = Counter(
        watcher.table.resolve("chat", "standard", "", running).deployment for _ in range(1000)
    )
    return chosen[CANARY] / 1000


async def test_a_model_deployment_routes_splits_scales_to_zero_and_holds(
    stack, tmp_path, monkeypatch
):
    # One release with the stack: its tokenizer takes this token, and so will ours.
    monkeypatch.setenv(SERVICE_TOKEN_ENV, stack.service_token)
    engine_port, router_port, http_port = free_port(), free_port(), free_port()
    base = f"http://127.0.0.1:{http_port}"

    def service(name: str, flags: dict) -> ManagedProcess:
        argv = serve_argv(name, {"metrics-port": free_port(), **flags})
        env = {SERVICE_TOKEN_ENV: stack.service_token}
        return ManagedProcess(f"{name}-md-e2e", argv, tmp_path / f"{name}.log", env=env)

    async with emulated_api() as (emulator, server):
        url = str(server.url)
        engine = service(
            "engine", {"port": engine_port, "engine-id": POD, "model-id": DEFAULT_MODEL_ID}
        )
        router = service(
            "router",
            {
                "port": router_port,
                "discovery": "kubernetes",
                "kubeconfig": write_kubeconfig(
                    tmp_path / "router.kubeconfig", url, "router-token", NAMESPACE
                ),
                "kubernetes-namespaces": [NAMESPACE],
                "poll-interval-seconds": 0.2,
            },
        )
        gateway_kubeconfig = write_kubeconfig(
            tmp_path / "gateway.kubeconfig", url, "gateway-token", NAMESPACE
        )
        gateway = service(
            "gateway",
            {
                "port": http_port,
                "grpc-port": free_port(),
                "redis-url": stack.redis_urls["gateway"],
                "tokenizer-address": stack.addresses["tokenizer"],
                "router-address": f"127.0.0.1:{router_port}",
                "routes-configmap": ROUTES.name,
                "routes-configmap-namespace": NAMESPACE,
                "kubeconfig": gateway_kubeconfig,
                "models-cache-seconds": 0,
                "hold-timeout-seconds": HOLD_LIMIT_SECONDS,
                "usage-spool-dir": tmp_path / "spool",
            },
        )
        kubelet = Kubelet(emulator, server.client, engine_port)
        # The gateway's own table code, fed by the same watch, for 1,000 picks.
        table = RoutesWatcher(
            "",
            configmap=RoutesConfigMapWatch(
                async_client(str(gateway_kubeconfig)), NAMESPACE, ROUTES.name
            ),
        )
        started = [engine, router, gateway]
        for process in started:
            process.start()
        kubelet_task = asyncio.create_task(kubelet.run())
        try:
            for process, probe in (
                (router, f"127.0.0.1:{router_port}"),
                (engine, f"127.0.0.1:{engine_port}"),
            ):
                await wait_ready(process, probe, 300)
            table.start()
            async with operator_running(url, f"127.0.0.1:{router_port}", ROUTES):
                await _run(emulator, server.client, table, (gateway, base), stack, kubelet)
        finally:
            await table.stop()
            kubelet_task.cancel()
            for process in reversed(started):
                process.stop(10)
        check_operator_calls(emulator)


async def _run(emulator, client, table, gateway, stack, kubelet):
    reply = await client.post(MDS_PATH, json=model_deployment())
    assert reply.status == 200, await reply.text()
    # Ready once it has a model to serve: the alias, at zero replicas, served by holding.
    process, base = gateway
    await wait_ready(process, f"{base}/readyz", 120)

    # The routes reach the gateway's table through the API: a 10% canary.
    await eventually(lambda: "chat" in table.table.models, what="the routes in the table")
    assert abs(canary_share(table) - 0.10) <= 0.05
    reply = await client.patch(
        f"{MDS_PATH}/demo",
        json={"spec": {"canary": {"weight": 40}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert reply.status == 200
    await eventually(lambda: table.table.models["chat"].routes[-1].weight == 40, what="new weight")
    assert abs(canary_share(table) - 0.40) <= 0.05

    tenant, key = await new_tenant_key(stack.redis_url)
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": "chat", "prompt": "Hello", "max_tokens": 3}
    async with httpx.AsyncClient(timeout=60) as http:
        # The gateway process lists the alias while nothing runs: it is served by holding.
        assert await _lists(http, base, headers, "chat")
        # The operator's scale-to-zero status is a write of its own, after the objects'
        # (a loaded CI run read the status between the two).
        await eventually(
            lambda: (md(emulator).get("status") or {}).get("scaledToZero") is True,
            what="scaledToZero at the start",
        )

        started = time.monotonic()
        served = await http.post(f"{base}/v1/completions", headers=headers, json=body)
        held_for = time.monotonic() - started
        assert served.status_code == 200, served.text
        assert {"RequestsHeld", "ColdStart"} <= set(reasons(emulator))
        print(f"\ncold start: request held {held_for:.2f}s until a replica was ready")

        redis = open_redis(stack.redis_url)
        try:
            ledger = Ledger(redis, USAGE_STREAM, "billing", PriceTable())
            await eventually(lambda: _billed(ledger, tenant), timeout=60, what="billed")
        finally:
            await redis.aclose()

        # Idle for a second: drained and removed, back to zero.
        await eventually(lambda: not kubelet.running, timeout=30, what="scale to zero")
        await eventually(
            lambda: (md(emulator).get("status") or {}).get("scaledToZero") is True,
            what="scaledToZero",
        )
        assert "ColdStarted" in reasons(emulator)

        kubelet.can_start = False  # the next replica never gets ready
        refused = await http.post(f"{base}/v1/completions", headers=headers, json=body)
        assert refused.status_code == 503, refused.text
        assert int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["code"] == "service_unavailable"
        print(
            f"hold limit {HOLD_LIMIT_SECONDS}s: 503, Retry-After {refused.headers['Retry-After']}"
        )


async def _lists(http, base, headers, name: str) -> bool:
    reply = await http.get(f"{base}/v1/models", headers=headers)
    return reply.status_code == 200 and name in [m["id"] for m in reply.json()["data"]]


async def _billed(ledger: Ledger, tenant: str) -> bool:
    totals = await ledger.totals(tenant)
    return bool(totals) and totals[0].requests >= 1
