"""The gateway's routing table follows the operator's routes ConfigMap through the API (#17).

kmock's emulator over HTTP, the gateway's informer on lightkube's async client.
"""

import asyncio
import time
from collections import Counter

import kmock
import pytest
import yaml

from maas_services.common.kube_client import async_client
from maas_services.gateway.routing.routes_configmap import RoutesConfigMapWatch
from maas_services.gateway.routing.routes_watcher import RoutesWatcher
from tests.k8s.kubeconfig import write_kubeconfig

NAMESPACE = "maas"
NAME = "maas-operator-routes"
CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
RUNNING = {"smol", "smol-canary", "file-model"}

pytestmark = pytest.mark.timeout(60)


def fragment(canary_weight: int) -> str:
    routes = [
        {"deployment": "smol", "weight": 100 - canary_weight},
        {"deployment": "smol-canary", "weight": canary_weight},
    ]
    return yaml.safe_dump(
        {
            "models": {"chat": {"routes": routes}},
            "deployments": {"smol-canary": {"tokenizer": "smol"}},
        }
    )


async def eventually(check, timeout: float = 10.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def canary_share(watcher: RoutesWatcher, picks: int = 1000) -> float:
    chosen = Counter(
        watcher.table.resolve("chat", "standard", "", RUNNING).deployment for _ in range(picks)
    )
    return chosen["smol-canary"] / picks


async def test_weights_the_operator_writes_reach_the_table_and_a_delete_removes_them(
    tmp_path, monkeypatch
):
    routes_file = tmp_path / "routes.yaml"
    routes_file.write_text(
        "tiers: {gold: {weight: 8}}\nmodels:\n  mine: {routes: [{deployment: file-model}]}\n"
    )
    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.resources.load_bundled()
        kubeconfig = write_kubeconfig(
            tmp_path / "kubeconfig", server.url, "gateway-token", NAMESPACE
        )
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        watch = RoutesConfigMapWatch(async_client(str(kubeconfig)), NAMESPACE, NAME)
        watcher = RoutesWatcher(str(routes_file), configmap=watch)
        watcher.start()
        try:
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": NAME, "namespace": NAMESPACE},
                "data": {"maas.smol.yaml": fragment(10)},
            }
            response = await server.client.post(CONFIGMAPS, json=body)
            assert response.status == 200, await response.text()
            await eventually(lambda: "chat" in watcher.table.models, what="the operator's alias")
            assert abs(canary_share(watcher) - 0.10) <= 0.05
            # The file's own routes and tiers stay.
            assert watcher.table.tier("gold").weight == 8
            assert watcher.table.resolve("mine", "standard", "", RUNNING).deployment == "file-model"
            assert (
                watcher.table.resolve("chat", "standard", "s", {"smol-canary"}).tokenizer == "smol"
            )

            response = await server.client.patch(
                f"{CONFIGMAPS}/{NAME}",
                json={"data": {"maas.smol.yaml": fragment(60)}},
                headers={"Content-Type": "application/merge-patch+json"},
            )
            assert response.status == 200, await response.text()
            await eventually(
                lambda: watcher.table.models["chat"].routes[1].weight == 60, what="new weight"
            )
            assert abs(canary_share(watcher) - 0.60) <= 0.05

            response = await server.client.delete(f"{CONFIGMAPS}/{NAME}")
            assert response.status == 200, await response.text()
            await eventually(lambda: "chat" not in watcher.table.models, what="routes removed")
            assert "mine" in watcher.table.models
        finally:
            await watcher.stop()


def test_the_chart_lets_the_gateway_read_that_one_configmap_and_nothing_else():
    from tests.k8s.chart_render import rendered
    from tests.k8s.rbac import Call, Grants

    docs = rendered(NAMESPACE)
    grants = Grants.of(docs, "maas-gateway", NAMESPACE)
    (gateway,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "maas-gateway"
    ]
    env = {
        e["name"]: e.get("value")
        for e in gateway["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["MAAS_ROUTES_CONFIGMAP"] == NAME
    for verb in ("get", "list", "watch"):
        assert grants.allows(Call(verb, "", "configmaps", NAMESPACE, NAME))
    assert not grants.allows(Call("get", "", "configmaps", NAMESPACE, "maas-routing"))
    assert not grants.allows(Call("patch", "", "configmaps", NAMESPACE, NAME))
