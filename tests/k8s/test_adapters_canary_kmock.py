"""spec.adapters on a canary's replicas, through the real kopf operator against kmock.

As test_adapters_kmock, with a second fake kubelet playing the canary's
Deployment (`demo-engine-canary`) and a router that reports both pools, each
under its own model (`demo-model`, `demo-model-canary`), as the real router
pools a canary apart.
"""

import asyncio
import contextlib

import pytest

from maas.v1 import router_pb2, router_pb2_grpc
from maas_operator.modeldeployment.resources import names
from tests.k8s import fake_pool
from tests.k8s.test_adapters_kmock import (
    adapter,
    adapter_engines,  # noqa: F401 (a fixture)
    started_with,
    status_adapters,
)
from tests.k8s.test_adapters_sync import peft_folder
from tests.k8s.test_operator_kmock import (
    NAMESPACE,
    check_operator_calls,
    condition,
    create,
    emulated_api,
    eventually,
    model_deployment,
    operator_running,
    patch,
    replicas_asked,
)

pytestmark = pytest.mark.timeout(120)
CANARY = {"version": "v2", "weight": 10}


class CanaryPool(fake_pool.FakePool):
    """The kubelet of the canary's Deployment. Its owner name is only what its pods
    are named after (`demo-canary-engine-N`), apart from the main pool's."""

    def _deployment(self):
        key = (fake_pool.DEPLOYMENTS, self.namespace, names("demo")["canary"])
        if key not in self.emulator.objects or self.emulator.objects[key].deleted:
            return None
        return self.emulator.objects[key]


class BothPools(router_pb2_grpc.RouterServicer):
    """The router: each pool's statistics, as the test's fake router of each reports them."""

    def __init__(self, *pools):
        self.routers = [fake_pool.FakeRouter(pool) for pool in pools]

    async def GetPoolStats(self, request, context):
        answers = [await router.GetPoolStats(request, context) for router in self.routers]
        return router_pb2.PoolStats(deployments=[d for a in answers for d in a.deployments])


@contextlib.asynccontextmanager
async def cluster_with_canary():
    """kmock, the main and the canary kubelets, the router of both, and the operator."""
    async with emulated_api() as (emulator, server):
        main = fake_pool.FakePool(emulator, NAMESPACE, "demo", "demo-model")
        canary = CanaryPool(emulator, NAMESPACE, "demo-canary", "demo-model-canary")
        router, address = await fake_pool._serve(
            router_pb2_grpc.add_RouterServicer_to_server, BothPools(main, canary)
        )
        kubelets = [asyncio.create_task(pool.run()) for pool in (main, canary)]
        try:
            async with operator_running(str(server.url), address):
                yield emulator, server.client, main, canary
        finally:
            for kubelet in kubelets:
                kubelet.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await kubelet
            for pool in (main, canary):
                await pool.stop()
            await router.stop(None)
        check_operator_calls(emulator)


def loaded_everywhere(emulator, name: str, *pools) -> bool:
    """Loaded, on every replica of the pools (both tracks), by the status."""
    entry = status_adapters(emulator).get(name) or {}
    pods = sorted(pod for pool in pools for pod in pool.replicas)
    return bool(pods) and entry.get("state") == "Loaded" and sorted(entry["replicas"]) == pods


@contextlib.asynccontextmanager
async def sql_on_both_tracks(cluster: dict, sql):
    """A ModelDeployment with a canary and the preload adapter `sql` (the folder), once
    both tracks run and the status lists it loaded on every pod of both."""
    async with cluster_with_canary() as (emulator, client, main, canary):
        cluster["emulator"] = emulator
        await create(client, model_deployment(canary=CANARY, adapters=[adapter("sql", sql)]))
        await eventually(lambda: main.replicas and canary.replicas, what="both tracks")
        await eventually(
            lambda: loaded_everywhere(emulator, "sql", main, canary), what="sql everywhere"
        )
        yield emulator, client, main, canary


async def test_adapter_changes_reach_the_canarys_running_replicas(tmp_path, adapter_engines):  # noqa: F811
    engines, cluster = adapter_engines
    sql, tone = peft_folder(tmp_path, "sql"), peft_folder(tmp_path, "tone")
    async with sql_on_both_tracks(cluster, sql) as (emulator, client, main, canary):
        # Both tracks started with the preload adapter; the status lists both tracks' pods.
        (canary_pod,) = canary.replicas
        assert all(e.loads == [] for e in engines.values()), "started with it: nothing to load"

        # Added: loaded onto the canary's running replica as onto the main ones.
        await patch(client, {"spec": {"adapters": [adapter("sql", sql), adapter("tone", tone)]}})
        await eventually(
            lambda: loaded_everywhere(emulator, "tone", main, canary), what="tone everywhere"
        )
        assert engines[canary_pod].loads == ["tone"]
        assert set(canary.replicas) == {canary_pod}, "no canary replica was replaced"

        # Removed: unloaded from the canary too.
        await patch(client, {"spec": {"adapters": [adapter("sql", sql)]}})
        await eventually(lambda: set(status_adapters(emulator)) == {"sql"}, what="tone gone")
        assert engines[canary_pod].unloads == ["tone"] and "tone" not in engines[canary_pod].loaded
        ready = condition(emulator, "AdaptersReady")
        assert ready["status"] == "True" and ready["reason"] == "AdaptersLoaded"


async def test_a_canary_engine_that_never_answers_holds_up_no_scaling(tmp_path, adapter_engines):  # noqa: F811
    """The slowest canary: its LoadAdapter never answers. The main replicas still scale
    out, starting with the adapter; the canary gets it once it answers."""
    engines, cluster = adapter_engines
    sql, tone = peft_folder(tmp_path, "sql"), peft_folder(tmp_path, "tone")
    async with sql_on_both_tracks(cluster, sql) as (emulator, client, main, canary):
        (canary_pod,) = canary.replicas
        engines[canary_pod].hold = asyncio.Event()
        await patch(client, {"spec": {"adapters": [adapter("sql", sql), adapter("tone", tone)]}})
        await eventually(lambda: engines[canary_pod].loads == ["tone"], what="a hanging load")

        main.queue_depth = 30
        await eventually(lambda: replicas_asked(emulator) == 4, what="scale-out meanwhile")
        await eventually(lambda: len(main.replicas) == 4, what="the new main replicas")
        assert "tone" in started_with(emulator), "the new replicas start with it"
        engines[canary_pod].hold.set()
        await eventually(
            lambda: loaded_everywhere(emulator, "tone", main, canary),
            what="tone on the canary once it answers",
        )
        assert engines[canary_pod].loads == ["tone"], "asked once, not again meanwhile"
