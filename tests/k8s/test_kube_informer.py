"""The informer every service watches the API server with, against kmock with faults (#36).

A watch that ends in 410 Gone (its version compacted away, the change it
would have carried lost) is followed by a fresh list; an API server that
answers 500 for a while is retried with backoff until it answers again. In
both cases the cache ends equal to the server's objects.
"""

import asyncio
import contextlib

import kmock
import pytest
from lightkube.resources.core_v1 import ConfigMap

from maas_services.common.kube_client import async_client
from maas_services.common.kube_informer import Informer
from tests.k8s.apply_emulator import ApplyingEmulator
from tests.k8s.kubeconfig import write_kubeconfig
from tests.k8s.test_operator_kmock import eventually

NAMESPACE = "ns"
TOKEN = "informer-token"
CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"

pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def informing(tmp_path, monkeypatch, before=None):
    """kmock over HTTP and an informer on its ConfigMaps; before(emulator) runs first."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    async with ApplyingEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.resources.load_bundled()
        if before is not None:
            await before(emulator, server.client)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url, TOKEN, NAMESPACE)
        client = async_client(str(kubeconfig))
        informer = Informer(client, ConfigMap, NAMESPACE, name="configmaps")
        changes = []
        task = asyncio.create_task(informer.run(lambda: changes.append(1)))
        try:
            yield emulator, server.client, informer
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.close()


async def put(client, name: str, value: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"v": value},
    }
    response = await client.post(CONFIGMAPS, json=body)
    assert response.status == 200, await response.text()


def names(informer) -> set[str]:
    return {name for _, name in informer.objects}


async def test_a_change_lost_to_410_gone_is_found_by_the_relist(tmp_path, monkeypatch):
    async with informing(tmp_path, monkeypatch) as (emulator, client, informer):
        await put(client, "a", "1")
        await eventually(lambda: names(informer) == {"a"}, what="a listed or watched")
        assert informer.relists == 1
        # The watch gets 410 in place of the DELETED event: only a relist sees a go.
        emulator.expire_watches()
        response = await client.delete(f"{CONFIGMAPS}/a")
        assert response.status == 200
        await eventually(lambda: informer.relists == 2, what="a relist after 410")
        await eventually(lambda: names(informer) == set(), what="a gone from the cache")
        # The watch that follows the relist carries changes again.
        await put(client, "b", "2")
        await eventually(lambda: names(informer) == {"b"}, what="b watched")


async def test_an_api_server_failing_for_a_while_is_retried_until_it_answers(tmp_path, monkeypatch):
    async def failing(emulator, client):
        await put(client, "a", "1")
        emulator.outage(500, seconds=2.0, token=TOKEN)

    async with informing(tmp_path, monkeypatch, failing) as (emulator, client, informer):
        assert not informer.synced.is_set()
        await eventually(lambda: informer.synced.is_set(), timeout=30, what="the first list")
        assert names(informer) == {"a"}
        failed = [r for r in emulator if r.headers.get("Authorization") == f"Bearer {TOKEN}"]
        assert len(failed) >= 3, "listed again after each failure"
        # Failing again while watching: the watch ends, the relist waits out the outage.
        emulator.outage(500, seconds=1.5, token=TOKEN)
        emulator.expire_watches()
        await put(client, "b", "2")
        await eventually(lambda: names(informer) == {"a", "b"}, timeout=30, what="b after it")
