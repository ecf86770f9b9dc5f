"""Drift repair with the real kopf operator against kmock with server-side apply (#36).

An owned Deployment deleted is recreated, one edited by hand is restored, a
replica count another manager set is left alone, and an API server that drops
watches or answers 500 for a while only delays all of it: the operator ends
with the objects the spec asks for, Events and the Synced condition.
"""

import asyncio

import kmock
import pytest

from maas_operator.modeldeployment.kube import FIELD_MANAGER
from tests.k8s.test_operator_kmock import (
    NAMESPACE,
    OPERATOR_TOKEN,
    create,
    eventually,
    live,
    md,
    model_deployment,
    patch,
    reasons,
    replicas_asked,
    running_cluster,
)

pytestmark = pytest.mark.timeout(120)

DEPLOYMENTS = "apps/v1/deployments"
ENGINE = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/demo-engine"


def engine_container(emulator) -> dict:
    deployment = live(emulator, DEPLOYMENTS, "demo-engine")
    return deployment and deployment["spec"]["template"]["spec"]["containers"][0]


def synced(emulator) -> dict:
    conditions = (md(emulator).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Synced"), {})


async def running_engine(emulator, client, **spec) -> dict:
    """A ModelDeployment applied, its engine Deployment made; the Deployment as made."""
    await create(client, model_deployment(**spec))
    await eventually(lambda: synced(emulator).get("reason") == "Applied", what="Synced=Applied")
    return live(emulator, DEPLOYMENTS, "demo-engine")


async def edit_by_hand(client, body: dict, manager: str = "kubectl-edit") -> None:
    response = await client.patch(
        ENGINE,
        json=body,
        params={"fieldManager": manager},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200, await response.text()


async def delete_engine(client) -> None:
    response = await client.delete(ENGINE)
    assert response.status == 200, await response.text()


async def test_a_deleted_engine_deployment_is_recreated_with_an_event():
    async with running_cluster() as (emulator, client, pool):
        made = await running_engine(emulator, client)
        await delete_engine(client)
        again = await eventually(
            lambda: live(emulator, DEPLOYMENTS, "demo-engine"), what="the Deployment recreated"
        )
        assert again["metadata"]["uid"] != made["metadata"]["uid"]
        assert again["spec"]["template"] == made["spec"]["template"]
        await eventually(lambda: "Recreated" in reasons(emulator), what="a Recreated Event")
        await eventually(lambda: synced(emulator).get("reason") == "Recreated")
        assert synced(emulator)["status"] == "True"
        assert "Deployment/demo-engine was deleted" in synced(emulator)["message"]


async def test_an_edited_image_and_env_are_restored_and_fields_not_ours_are_kept():
    async with running_cluster() as (emulator, client, pool):
        made = await running_engine(emulator, client)
        container = made["spec"]["template"]["spec"]["containers"][0]
        image, env = container["image"], container["env"]
        tampered = [{**e, "value": "tampered"} if "value" in e else e for e in env]
        assert tampered != env
        edited = {
            **container,
            "image": "attacker.example/miner:1",
            "env": [*tampered, {"name": "EXTRA", "value": "1"}],
        }
        await edit_by_hand(client, {"spec": {"template": {"spec": {"containers": [edited]}}}})
        restored = await eventually(
            lambda: (c := engine_container(emulator)) and c["image"] == image and c,
            what="the image restored",
        )
        # What the operator sets is its own again; a variable it never set is someone else's.
        assert restored["env"][: len(env)] == env
        assert restored["env"][len(env) :] == [{"name": "EXTRA", "value": "1"}]
        await eventually(lambda: "DriftRepaired" in reasons(emulator), what="DriftRepaired")
        await eventually(lambda: synced(emulator).get("reason") == "DriftRepaired")


async def test_replicas_another_manager_set_are_left_alone_by_every_apply():
    async with running_cluster() as (emulator, client, pool):
        # A long stabilisation window: the autoscaler itself would not scale in here.
        await running_engine(
            emulator,
            client,
            autoscaling={"stabilizationSeconds": 600, "queueCapacityPerReplica": 10},
        )
        await edit_by_hand(client, {"spec": {"replicas": 3}}, manager="horizontal-pod-autoscaler")
        await patch(client, {"spec": {"engine": {"maxNumSeqs": 8}}})
        await eventually(
            lambda: "--max-num-seqs=8" in engine_container(emulator)["args"],
            what="the new spec rolled out",
        )
        await asyncio.sleep(1.0)  # several autoscaler ticks and drift checks
        assert replicas_asked(emulator) == 3
        assert "DriftRepaired" not in reasons(emulator)
        managed = emulator.managed[kmock.resource(DEPLOYMENTS), NAMESPACE, "demo-engine"]
        assert managed.owners(("f:spec", "f:replicas")) == ["horizontal-pod-autoscaler"]
        assert FIELD_MANAGER in managed.owners(("f:spec", "f:strategy", "f:type"))


async def test_a_delete_lost_to_an_expired_watch_is_still_repaired():
    async with running_cluster() as (emulator, client, pool):
        await running_engine(emulator, client)
        # The watch ends with 410 Gone in place of the DELETED event: only a
        # fresh list (which no longer has the Deployment) can tell.
        emulator.expire_watches()
        await delete_engine(client)
        await eventually(
            lambda: live(emulator, DEPLOYMENTS, "demo-engine"), what="the Deployment recreated"
        )
        await eventually(lambda: "Recreated" in reasons(emulator), what="a Recreated Event")


async def test_an_api_server_failing_for_a_while_delays_the_repair_but_it_converges():
    async with running_cluster() as (emulator, client, pool):
        await running_engine(emulator, client)
        emulator.outage(500, seconds=3.0, token=OPERATOR_TOKEN)
        await delete_engine(client)
        await eventually(
            lambda: live(emulator, DEPLOYMENTS, "demo-engine"),
            timeout=60,
            what="the Deployment recreated after the outage",
        )
        await eventually(lambda: synced(emulator).get("reason") == "Recreated", timeout=30)
        assert synced(emulator)["status"] == "True"
        assert "Recreated" in reasons(emulator)
        # Still serving the spec: a change after the outage rolls out as usual.
        await patch(client, {"spec": {"engine": {"maxNumSeqs": 8}}})
        await eventually(lambda: "--max-num-seqs=8" in engine_container(emulator)["args"])
