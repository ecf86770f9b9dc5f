"""Which events of an owned Deployment are drift, and how a repair reports (drift.py)."""

import httpx2
from lightkube import ApiError
from lightkube.models.meta_v1 import Status

from maas_operator.modeldeployment.drift import DriftWatch, transient

OWNER = {"apiVersion": "maas.io/v1alpha1", "kind": "ModelDeployment", "uid": "md-1"}


def deployment(generation: int = 1, labels=None, status=None) -> dict:
    return {
        "metadata": {
            "uid": "d-1",
            "generation": generation,
            "labels": labels or {"maas.io/model-deployment": "demo"},
            "ownerReferences": [{**OWNER, "name": "demo", "controller": True}],
        },
        "status": status or {},
    }


def test_a_spec_label_or_delete_is_drift_a_status_update_is_not():
    watch = DriftWatch()
    assert watch.owner_to_repair(None, deployment()) is None  # kopf's initial listing
    assert watch.owner_to_repair("MODIFIED", deployment(status={"readyReplicas": 1})) is None
    assert watch.owner_to_repair("MODIFIED", deployment(generation=2)) == "md-1"
    assert watch.owner_to_repair("MODIFIED", deployment(generation=2)) is None
    assert watch.owner_to_repair("MODIFIED", deployment(2, {"other": "x"})) == "md-1"
    assert watch.owner_to_repair("DELETED", deployment(2, {"other": "x"})) == "md-1"


def test_an_object_without_a_model_deployment_controller_is_never_repaired():
    unowned = deployment()
    unowned["metadata"]["ownerReferences"] = []
    assert DriftWatch().owner_to_repair("DELETED", unowned) is None


def api_error(code: int) -> ApiError:
    return ApiError(status=Status(code=code, message="m"))


async def test_a_repair_retries_what_the_server_refuses_for_a_while():
    answers = [
        api_error(500),
        api_error(409),
        {"Deployment/d": "created", "Service/s": "unchanged"},
    ]

    async def apply():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    repair = await DriftWatch().repaired(apply)
    assert answers == []
    assert repair.status and repair.reason == "Recreated"
    assert [e[1] for e in repair.events] == ["Recreated"]
    assert await DriftWatch().repaired(_unchanged) is None


async def _unchanged():
    return {"Deployment/d": "unchanged"}


async def test_a_refusal_that_is_not_transient_fails_the_repair_at_once():
    async def apply():
        raise api_error(422)

    repair = await DriftWatch().repaired(apply)
    assert not repair.status and repair.reason == "RepairFailed"
    assert transient(httpx2.ConnectError("refused")) and not transient(api_error(403))
