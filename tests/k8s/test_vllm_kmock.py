"""The real operator against kmock: a backend-vllm ModelDeployment becomes a vLLM pod template,
and one naming a vLLM image off the allow-list, or a claim not labelled as a model store,
is refused with a condition, creating nothing."""

import pytest

from maas_operator.modeldeployment.model_store import STORE_LABEL
from maas_operator.modeldeployment.vllm_pod import DEFAULT_VLLM_IMAGE
from tests.k8s.test_operator_kmock import (
    NAMESPACE,
    OWNED,
    condition,
    create,
    events,
    eventually,
    live,
    md,
    model_deployment,
    patch,
    running_cluster,
)

pytestmark = pytest.mark.timeout(120)

VLLM = {
    "engine": {"backend": "vllm", "vllm": {"image": "attacker.example/vllm:latest"}},
    "model": {"name": "demo-model", "source": {"uri": "pvc://model-store/demo"}},
    "resources": {"gpus": 1},
}


def claim(labels: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "model-store", "namespace": NAMESPACE, "labels": labels},
        "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }


async def create_claim(client, labels: dict[str, str]) -> None:
    path = f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims"
    response = await client.post(path, json=claim(labels))
    assert response.status == 200, await response.text()


async def test_a_vllm_spec_is_refused_for_its_image_then_runs_on_the_default():
    async with running_cluster() as (emulator, client, pool):
        await create_claim(client, {STORE_LABEL: "true"})
        await create(client, model_deployment(**VLLM))
        ready = await eventually(
            lambda: (c := condition(emulator, "Ready")) and c["status"] == "False" and c,
            what="Ready=False",
        )
        assert ready["reason"] == "ImageNotAllowed"
        assert ready["message"].startswith("spec.engine.vllm.image 'attacker.example/vllm:latest'")
        await eventually(
            lambda: [e for e in events(emulator) if e.get("reason") == "ImageNotAllowed"],
            what="the ImageNotAllowed Event",
        )
        assert not any(live(emulator, r, n) for r, n in OWNED)

        # Without an image of its own the spec gets the operator's, which is its configuration.
        await patch(client, {"spec": {"engine": {"vllm": {"image": None}}}})
        deployment = await eventually(
            lambda: live(emulator, "apps/v1/deployments", "demo-engine"), what="the Deployment"
        )
        pod = deployment["spec"]["template"]["spec"]
        adapter, server = pod["containers"]
        assert adapter["name"] == "engine" and "--backend=vllm" in adapter["args"]
        assert server["image"] == DEFAULT_VLLM_IMAGE
        assert "--model=/models/model-store/demo" in server["args"]
        assert server["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        await eventually(lambda: condition(emulator, "Ready")["status"] == "True", what="Ready")
        # The router's pool and the autoscaler see it as any engine: replicas come ready.
        assert md(emulator)["status"]["selector"].startswith("maas.io/model-deployment=demo")


async def test_a_pvc_source_needs_a_claim_labelled_as_a_model_store():
    async with running_cluster() as (emulator, client, pool):
        await create_claim(client, {"team": "data"})  # someone's claim, not a model store
        spec = {**VLLM, "engine": {"backend": "vllm"}}
        await create(client, model_deployment(**spec))
        ready = await eventually(
            lambda: (c := condition(emulator, "Ready")) and c["status"] == "False" and c,
            what="Ready=False",
        )
        assert ready["reason"] == "ClaimNotAllowed"
        assert "'model-store'" in ready["message"] and STORE_LABEL in ready["message"]
        await eventually(
            lambda: [e for e in events(emulator) if e.get("reason") == "ClaimNotAllowed"],
            what="the ClaimNotAllowed Event",
        )
        assert not any(live(emulator, r, n) for r, n in OWNED)

        # Its owner labels it as a model store: the same spec starts, unchanged.
        response = await client.patch(
            f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/model-store",
            json={"metadata": {"labels": {STORE_LABEL: "true"}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert response.status == 200, await response.text()
        deployment = await eventually(
            lambda: live(emulator, "apps/v1/deployments", "demo-engine"), what="the Deployment"
        )
        volumes = deployment["spec"]["template"]["spec"]["volumes"]
        assert {"claimName": "model-store", "readOnly": True} in [
            v.get("persistentVolumeClaim") for v in volumes
        ]
