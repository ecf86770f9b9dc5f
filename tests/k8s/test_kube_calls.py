"""The operator's own API calls (apply, pod lookup) against kmock over HTTP."""

import contextlib

import kmock

from maas_operator.modeldeployment import resources
from maas_operator.modeldeployment.autoscale import find_pod
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.kube import Credentials, KubeApi, object_path
from maas_operator.modeldeployment.reconcile import apply
from tests.k8s.emulator import StampingEmulator

OWNER = {"metadata": {"name": "m", "namespace": "ns", "uid": "u-1"}}


@contextlib.asynccontextmanager
async def api_server():
    async with StampingEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.resources.load_bundled()
        api = KubeApi(Credentials(server=str(server.url)))
        try:
            yield api
        finally:
            await api.close()


async def test_apply_creates_then_skips_then_replaces_what_the_spec_dropped():
    async with api_server() as api:
        placed = defaulted_spec({"resources": {"nodeSelector": {"gpu": "h200", "zone": "a"}}})
        assert await apply(api, resources.deployment(OWNER, placed, "img", 2)) == "created"
        assert await apply(api, resources.deployment(OWNER, placed, "img", 5)) == "unchanged"
        path = object_path("Deployment", "ns", "m-engine")
        # A controller's own annotation, which the operator must leave alone.
        await api.merge_patch(path, {"metadata": {"annotations": {"deployment/revision": "3"}}})
        moved = defaulted_spec({"resources": {"nodeSelector": {"gpu": "h200"}}})
        assert await apply(api, resources.deployment(OWNER, moved, "img", 5)) == "updated"
        current = await api.get(path)
        assert current["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": "h200"}
        assert current["spec"]["replicas"] == 2, "replicas belong to the autoscaler"
        assert current["metadata"]["annotations"]["deployment/revision"] == "3"


async def test_find_pod_by_endpoint_name_then_by_pod_ip():
    async with api_server() as api:
        labels = resources.selector("m")
        for name, ip, owner_labels in [
            ("m-engine-a", "10.0.0.7", labels),
            ("other-engine-b", "10.0.0.8", resources.selector("other")),
        ]:
            await api.create(
                object_path("Pod", "ns"),
                {"metadata": {"name": name, "labels": owner_labels}, "status": {"podIP": ip}},
            )
        assert await find_pod(api, "ns", "m", "m-engine-a", "1.2.3.4:50051") == "m-engine-a"
        assert await find_pod(api, "ns", "m", "e1", "10.0.0.7:50051") == "m-engine-a"
        # Another ModelDeployment's pod is never the one to remove.
        assert await find_pod(api, "ns", "m", "other-engine-b", "10.9.9.9:1") is None
        assert await find_pod(api, "ns", "m", "e2", "10.0.0.8:50051") is None
