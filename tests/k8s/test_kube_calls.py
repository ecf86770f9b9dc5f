"""The operator's own API calls (server-side apply, pod lookup) against kmock over HTTP."""

import contextlib

import kmock

from maas_operator.modeldeployment import resources
from maas_operator.modeldeployment.autoscale import find_pod
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.kube import (
    AUTOSCALER_MANAGER,
    FIELD_MANAGER,
    Credentials,
    KubeApi,
)
from maas_operator.modeldeployment.reconcile import apply
from tests.k8s.apply_emulator import ApplyingEmulator

OWNER = {"metadata": {"name": "m", "namespace": "ns", "uid": "u-1"}}
DEPLOYMENTS = kmock.resource("apps/v1/deployments")


@contextlib.asynccontextmanager
async def api_server():
    async with ApplyingEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.resources.load_bundled()
        api = KubeApi(Credentials(server=str(server.url)))
        try:
            yield api, emulator
        finally:
            await api.close()


async def test_apply_creates_then_skips_then_drops_what_the_spec_dropped():
    async with api_server() as (api, emulator):
        placed = defaulted_spec({"resources": {"nodeSelector": {"gpu": "h200", "zone": "a"}}})
        main = resources.deployment(OWNER, placed, "img", 2)
        assert await apply(api, main, autoscaled=True) == "created"
        assert await apply(api, resources.deployment(OWNER, placed, "img", 5), True) == "unchanged"
        # A controller's own annotation, which the operator must leave alone.
        await api.merge_patch(
            "Deployment",
            "ns",
            "m-engine",
            {"metadata": {"annotations": {"deployment/revision": "3"}}},
        )
        moved = defaulted_spec({"resources": {"nodeSelector": {"gpu": "h200"}}})
        assert await apply(api, resources.deployment(OWNER, moved, "img", 5), True) == "updated"
        current = await api.get("Deployment", "ns", "m-engine")
        assert current["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": "h200"}
        assert current["spec"]["replicas"] == 2, "replicas belong to the autoscaler"
        assert current["metadata"]["annotations"]["deployment/revision"] == "3"
        managed = emulator.managed[DEPLOYMENTS, "ns", "m-engine"]
        assert managed.owners(("f:spec", "f:replicas")) == [AUTOSCALER_MANAGER]
        assert managed.owners(("f:spec", "f:strategy", "f:type")) == [FIELD_MANAGER]


async def test_find_pod_by_endpoint_name_then_by_pod_ip():
    async with api_server() as (api, _):
        labels = resources.selector("m")
        for name, ip, owner_labels in [
            ("m-engine-a", "10.0.0.7", labels),
            ("other-engine-b", "10.0.0.8", resources.selector("other")),
        ]:
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "ns", "labels": owner_labels},
                "spec": {"containers": [{"name": "engine", "image": "img"}]},
                "status": {"podIP": ip},
            }
            await api.create(pod)
        assert await find_pod(api, "ns", "m", "m-engine-a", "1.2.3.4:50051") == "m-engine-a"
        assert await find_pod(api, "ns", "m", "e1", "10.0.0.7:50051") == "m-engine-a"
        # Another ModelDeployment's pod is never the one to remove.
        assert await find_pod(api, "ns", "m", "other-engine-b", "10.9.9.9:1") is None
        assert await find_pod(api, "ns", "m", "e2", "10.0.0.8:50051") is None
