"""spec.adapters end to end through the real kopf operator against kmock's emulator.

As test_operator_kmock, with engines that answer the adapter RPCs
(test_adapters_sync.AdapterEngine) and start with the preload adapters their
pod's MAAS_LORA_MODULES names (the kubelet resolving the ConfigMap reference),
and a router that reports each replica's adapters, as the real one relays
LoadReport.adapters.
"""

import asyncio
import json

import pytest

from tests.k8s import fake_pool
from tests.k8s.test_adapters_sync import AdapterEngine, peft_folder
from tests.k8s.test_operator_kmock import (
    NAMESPACE,
    condition,
    create,
    events,
    eventually,
    live,
    md,
    model_deployment,
    patch,
    replicas_asked,
    running_cluster,
)
from tests.k8s.test_routes_kmock import ROUTES, routes

pytestmark = pytest.mark.timeout(120)


def started_with(emulator) -> dict[str, str]:
    """The preload adapters a pod starting now gets: its MAAS_LORA_MODULES, from the
    ConfigMap its template names."""
    template = live(emulator, "apps/v1/deployments", "demo-engine")["spec"]["template"]
    env = template["spec"]["containers"][0]["env"]
    refs = [e["valueFrom"]["configMapKeyRef"] for e in env if e["name"] == "MAAS_LORA_MODULES"]
    configmap = refs and live(emulator, "v1/configmaps", refs[0]["name"])
    if not configmap:
        return {}
    modules = json.loads(configmap["data"][refs[0]["key"]])
    return dict(module.split("=", 1) for module in modules)


@pytest.fixture
def adapter_engines(monkeypatch) -> tuple[dict, dict]:
    """The FakePool's engines, by pod, answering adapter RPCs; and where the test puts
    the emulator for them to start from."""
    engines: dict[str, AdapterEngine] = {}
    cluster: dict = {}

    class StartingEngine(AdapterEngine):
        def __init__(self, replica):
            super().__init__(replica, started_with(cluster["emulator"]))
            engines[replica.pod] = self

    class AdapterRouter(fake_pool.FakeRouter):
        async def GetPoolStats(self, request, context):
            stats = await super().GetPoolStats(request, context)
            for deployment in stats.deployments:
                for replica in deployment.replicas:
                    replica.adapters.extend(engines[replica.endpoint_id].loaded)
            return stats

    monkeypatch.setattr(fake_pool, "FakeEngine", StartingEngine)
    monkeypatch.setattr(fake_pool, "FakeRouter", AdapterRouter)
    return engines, cluster


def status_adapters(emulator) -> dict[str, dict]:
    return {e["name"]: e for e in (md(emulator).get("status") or {}).get("adapters") or []}


def adapter(name: str, folder, load: str = "preload", **fields) -> dict:
    return {"name": name, "source": {"uri": f"file://{folder}"}, "load": load, **fields}


async def test_adapters_load_as_the_spec_changes_without_a_new_pod_and_failures_are_said(
    tmp_path, adapter_engines
):
    engines, cluster = adapter_engines
    sql, chat, tone = (peft_folder(tmp_path, n) for n in ("sql", "chat", "tone"))
    spec = {
        "replicas": {"min": 2, "max": 4},
        "adapters": [adapter("sql", sql), adapter("chat", chat, "on-demand", tenants=["acme"])],
    }
    async with running_cluster(routes=ROUTES) as (emulator, client, pool):
        cluster["emulator"] = emulator
        await create(client, model_deployment(**spec))

        # Replicas start with the preload adapter; the status says where it is.
        def loaded(name: str, count: int):
            entry = status_adapters(emulator).get(name)
            return entry and entry["state"] == "Loaded" and len(entry["replicas"]) == count

        await eventually(lambda: loaded("sql", 2), what="sql on both replicas")
        assert sorted(status_adapters(emulator)["sql"]["replicas"]) == sorted(pool.replicas)
        assert status_adapters(emulator)["chat"]["state"] == "OnDemand"
        assert all(e.loads == [] for e in engines.values()), "started with it: nothing to load"
        ready = await eventually(lambda: condition(emulator, "AdaptersReady"), what="condition")
        assert ready["status"] == "True" and ready["reason"] == "AdaptersLoaded"
        await eventually(lambda: (routes(emulator) or {}).get("adapters"), what="routes")
        assert routes(emulator)["adapters"]["chat"] == {
            "deployment": "demo-model",
            "source": str(chat),
            "load": "on-demand",
            "tenants": ["acme"],
        }

        # A new adapter loads onto the running replicas: the pod template stays as it was.
        template = live(emulator, "apps/v1/deployments", "demo-engine")["spec"]["template"]
        await patch(client, {"spec": {"adapters": [*spec["adapters"], adapter("tone", tone)]}})
        await eventually(lambda: loaded("tone", 2), what="tone loaded by LoadAdapter")
        assert all(e.loads == ["tone"] for e in engines.values())
        assert live(emulator, "apps/v1/deployments", "demo-engine")["spec"]["template"] == template
        assert set(pool.replicas) == set(engines), "no replica was replaced"
        assert "tone" in started_with(emulator), "a replica starting now gets it from the start"

        # A bad folder: AdaptersReady=False in the engine's words, once as an Event.
        bad = adapter("broken", tmp_path / "not-a-peft-folder")
        await patch(
            client,
            {"spec": {"adapters": [*spec["adapters"], adapter("tone", tone), bad]}},
        )
        failed = await eventually(
            lambda: (c := condition(emulator, "AdaptersReady")) and c["status"] == "False" and c,
            what="AdaptersReady=False",
        )
        assert failed["reason"] == "AdapterInvalid"
        assert "not-a-peft-folder: no adapter_config.json" in failed["message"]
        assert status_adapters(emulator)["broken"]["state"] == "Failed"
        assert status_adapters(emulator)["tone"]["state"] == "Loaded"
        await eventually(
            lambda: [e for e in events(emulator) if e.get("reason") == "AdapterInvalid"],
            what="the AdapterInvalid Event",
        )

        # Removed from the spec: unloaded from every replica, gone from the status.
        await patch(client, {"spec": {"adapters": spec["adapters"]}})
        await eventually(
            lambda: set(status_adapters(emulator)) == {"sql", "chat"}, what="tone unloaded"
        )
        assert all(e.unloads == ["tone"] and "tone" not in e.loaded for e in engines.values())
        await eventually(lambda: condition(emulator, "AdaptersReady")["status"] == "True")
        assert all(e.loads.count("broken") == 1 for e in engines.values()), "not retried at once"

        # Deleted: its preload list leaves the namespace's ConfigMap with it.
        response = await client.delete(
            f"/apis/maas.io/v1alpha1/namespaces/{NAMESPACE}/modeldeployments/demo"
        )
        assert response.status == 200
        await eventually(lambda: md(emulator) is None, what="the finalizer to be released")
        configmap = live(emulator, "v1/configmaps", "maas-engine-adapters")
        assert "demo" not in (configmap.get("data") or {})


async def test_an_adapter_named_as_the_model_or_on_a_foreign_claim_is_refused(
    tmp_path, adapter_engines
):
    engines, cluster = adapter_engines
    sql = peft_folder(tmp_path, "sql")
    async with running_cluster() as (emulator, client, _pool):
        cluster["emulator"] = emulator
        await create(client, model_deployment(adapters=[adapter("demo-model", sql)]))
        ready = await eventually(
            lambda: (c := condition(emulator, "Ready")) and c["status"] == "False" and c,
            what="Ready=False",
        )
        assert ready["reason"] == "AdapterNameConflict"
        assert "spec.adapters[0].name 'demo-model' is the model's id" in ready["message"]
        assert live(emulator, "apps/v1/deployments", "demo-engine") is None
        assert engines == {}

        # A claim that is no model store is refused as the model's would be.
        store = {"name": "sql", "source": {"uri": "pvc://team-data/adapters/sql"}}
        await patch(client, {"spec": {"adapters": [store]}})
        ready = await eventually(
            lambda: (c := condition(emulator, "Ready")) and c["reason"] == "ClaimNotFound" and c,
            what="ClaimNotFound",
        )
        assert ready["message"].startswith("spec.adapters[0].source.uri 'pvc://team-data/")
        assert live(emulator, "apps/v1/deployments", "demo-engine") is None


async def test_an_engine_that_never_answers_loadadapter_holds_up_no_scaling(
    tmp_path, adapter_engines
):
    """The slowest engine: its LoadAdapter never answers. The deployment still scales
    out, and the replicas it adds start with the adapter (the ConfigMap)."""
    engines, cluster = adapter_engines
    sql, tone = peft_folder(tmp_path, "sql"), peft_folder(tmp_path, "tone")
    async with running_cluster() as (emulator, client, pool):
        cluster["emulator"] = emulator
        await create(client, model_deployment(adapters=[adapter("sql", sql)]))
        await eventually(
            lambda: (status_adapters(emulator).get("sql") or {}).get("state") == "Loaded",
            what="sql loaded",
        )
        (first,) = engines.values()
        first.hold = asyncio.Event()
        await patch(client, {"spec": {"adapters": [adapter("sql", sql), adapter("tone", tone)]}})
        await eventually(lambda: first.loads == ["tone"], what="a LoadAdapter that hangs")

        pool.queue_depth = 30
        await eventually(lambda: replicas_asked(emulator) == 4, what="scale-out meanwhile")
        await eventually(lambda: len(engines) == 4, what="the new replicas")
        started = [e for e in engines.values() if e is not first]
        assert all(set(e.loaded) == {"sql", "tone"} and e.loads == [] for e in started)
        first.hold.set()
        await eventually(
            lambda: (status_adapters(emulator).get("tone") or {}).get("state") == "Loaded",
            what="tone on every replica once the engine answers",
        )
