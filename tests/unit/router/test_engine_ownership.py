"""Which engine Services the router pools: owned, by UID, by a ModelDeployment of that model
in the Service's namespace, which is the model id's first claimant."""

from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from maas_services.common.model_claims import Claimant, conflicts
from maas_services.router.discovery.ownership import OwnerCheck, refusal


def deployment(name: str, uid: str, model: str = "", namespace: str = "ns", created="") -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "creationTimestamp": created or "2026-01-01T00:00:00Z",
        },
        "spec": {"model": {"name": model}} if model else {},
    }


def service(model: str, owner_uid: str | None = None, namespace="ns", **ref) -> dict:
    meta = {"name": f"{model}-engine", "namespace": namespace, "labels": {"maas.io/model": model}}
    if owner_uid:
        meta["ownerReferences"] = [
            {
                "apiVersion": "maas.io/v1alpha1",
                "kind": "ModelDeployment",
                "name": "x",
                "uid": owner_uid,
                "controller": True,
                **ref,
            }
        ]
    return {"metadata": meta}


def verdict(svc: dict, *deployments: dict) -> str | None:
    claimants = [Claimant.of(d) for d in deployments]
    return refusal(svc, {c.uid: c for c in claimants}, set(conflicts(claimants)))


def test_the_owner_chain_decides():
    qwen = deployment("qwen", "u1", model="qwen2.5")
    assert verdict(service("qwen2.5", "u1"), qwen) is None
    # Its canary's pool is its own too.
    assert verdict(service("qwen2.5-canary", "u1"), qwen) is None
    assert verdict(service("qwen2.5"), qwen) == "unowned"
    assert verdict(service("qwen2.5", "u1", controller=False), qwen) == "unowned"
    assert verdict(service("qwen2.5", "u1", kind="Deployment"), qwen) == "unowned"
    assert verdict(service("qwen2.5", "u1", apiVersion="evil.io/v1"), qwen) == "unowned"
    assert verdict(service("qwen2.5", "u2"), qwen) == "owner_not_found"
    # An owner reference never crosses namespaces: the same UID elsewhere is no owner.
    assert verdict(service("qwen2.5", "u1", namespace="other"), qwen) == "owner_not_found"
    assert verdict(service("llama", "u1"), qwen) == "other_model"


def test_a_model_id_belongs_to_its_first_claimant():
    first = deployment("b", "u1", model="m", created="2026-01-01T00:00:00Z")
    later = deployment("a", "u2", model="m", created="2026-01-02T00:00:00Z")
    same_second = deployment("c", "u3", model="m", created="2026-01-01T00:00:00Z")
    # A model named like another's canary collides with that canary's pool.
    canary_squatter = deployment("d", "u4", model="m-canary", created="2026-01-03T00:00:00Z")
    found = conflicts(Claimant.of(d) for d in (later, same_second, canary_squatter, first))
    assert set(found) == {"u2", "u3", "u4"}
    assert found["u2"].holder.name == "b" and found["u4"].model == "m-canary"
    assert verdict(service("m", "u2"), first, later) == "model_id_conflict"


def test_refused_services_are_left_out_and_reported_once():
    qwen = deployment("qwen", "u1", model="qwen2.5")
    check = OwnerCheck()
    services = [service("qwen2.5", "u1"), service("rogue")]
    counted = REGISTRY.get_sample_value(
        "maas_router_engine_services_refused_total", {"reason": "unowned"}
    )
    # capture_logs, not capsys: what reaches stdout depends on how earlier tests
    # in the same process configured logging.
    with capture_logs() as logged:
        for _ in range(3):
            assert check.pooled(services, [qwen]) == services[:1]
    refused = [e for e in logged if e["event"] == "engine_service_refused"]
    assert len(refused) == 1 and "rogue" in str(refused[0])
    assert (
        REGISTRY.get_sample_value(
            "maas_router_engine_services_refused_total", {"reason": "unowned"}
        )
        == (counted or 0) + 1
    )
