"""Two ModelDeployments claiming one model id: the later one gets ModelIdConflict and is not
Ready (the router pools none of its engines: tests/integration/router/test_kubernetes_discovery.py);
once the earlier one is gone, the id is the later one's."""

import pytest

from tests.k8s.test_operator_kmock import (
    MDS,
    NAMESPACE,
    create,
    eventually,
    live,
    model_deployment,
    running_cluster,
)

pytestmark = pytest.mark.timeout(120)


def conditions(emulator, name: str) -> dict[str, dict]:
    obj = live(emulator, MDS, name) or {}
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions", [])}


async def test_the_later_claimant_of_a_model_id_gets_a_condition():
    async with running_cluster() as (emulator, client, pool):
        await create(client, model_deployment())  # "demo", serving demo-model
        await eventually(lambda: conditions(emulator, "demo").get("Ready"), what="demo's Ready")
        later = model_deployment()
        later["metadata"]["name"] = "demo-copy"
        await create(client, later)

        conflict = await eventually(
            lambda: (
                (c := conditions(emulator, "demo-copy").get("ModelIdConflict"))
                and c["status"] == "True"
                and c
            ),
            what="ModelIdConflict on the later one",
        )
        assert conflict["reason"] == "ModelIdConflict"
        assert "'demo-model'" in conflict["message"] and f"{NAMESPACE}/demo" in conflict["message"]
        ready = conditions(emulator, "demo-copy")["Ready"]
        assert ready["status"] == "False" and ready["reason"] == "ModelIdConflict"
        assert conditions(emulator, "demo")["ModelIdConflict"]["status"] == "False"

        response = await client.delete(
            f"/apis/maas.io/v1alpha1/namespaces/{NAMESPACE}/modeldeployments/demo"
        )
        assert response.status == 200, await response.text()
        await eventually(
            lambda: conditions(emulator, "demo-copy")["ModelIdConflict"]["status"] == "False",
            what="the conflict resolved",
        )
