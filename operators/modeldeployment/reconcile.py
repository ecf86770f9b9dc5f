"""Create, update and delete the objects a ModelDeployment owns.

Each owned object carries a hash of what the operator last wanted it to be;
an object whose hash matches is left alone, so a resume or an unrelated edit
costs a GET, not a rollout.
"""

import hashlib
import json

from maas_operator.modeldeployment import resources
from maas_operator.modeldeployment.kube import KubeApi, object_path
from maas_operator.modeldeployment.vllm_pod import DEFAULT_VLLM_IMAGE

HASH_ANNOTATION = "maas.io/desired-hash"
# The autoscaler owns Deployment replicas; selectors are immutable.
UNMANAGED_SPEC_KEYS = {"Deployment": {"replicas", "selector"}}


def desired_hash(obj: dict) -> str:
    unmanaged = UNMANAGED_SPEC_KEYS.get(obj["kind"], set())
    managed = {
        "metadata": obj["metadata"],
        "spec": {k: v for k, v in obj["spec"].items() if k not in unmanaged},
    }
    return hashlib.sha256(json.dumps(managed, sort_keys=True).encode()).hexdigest()[:16]


def _pointer(key: str) -> str:
    """A map key as one JSON-pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


async def apply(api: KubeApi, obj: dict) -> str:
    """'created', 'updated' or 'unchanged'."""
    meta = obj["metadata"]
    digest = desired_hash(obj)
    meta.setdefault("annotations", {})[HASH_ANNOTATION] = digest
    current = await api.get(object_path(obj["kind"], meta["namespace"], meta["name"]))
    if current is None:
        await api.create(object_path(obj["kind"], meta["namespace"]), obj)
        return "created"
    if (current["metadata"].get("annotations") or {}).get(HASH_ANNOTATION) == digest:
        return "unchanged"
    unmanaged = UNMANAGED_SPEC_KEYS.get(obj["kind"], set())
    # JSON-patch `add` replaces whole members, so fields the spec dropped
    # (a nodeSelector key, a toleration) really go away; a merge patch would keep them.
    ops = [
        {"op": "add", "path": f"/metadata/{key}", "value": meta[key]}
        for key in ("labels", "ownerReferences")
    ]
    # Annotations one by one: controllers keep their own there (a Deployment's revision).
    if current["metadata"].get("annotations"):
        ops += [
            {"op": "add", "path": f"/metadata/annotations/{_pointer(key)}", "value": value}
            for key, value in meta["annotations"].items()
        ]
    else:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": meta["annotations"]})
    ops += [
        {"op": "add", "path": f"/spec/{key}", "value": value}
        for key, value in obj["spec"].items()
        if key not in unmanaged
    ]
    await api.json_patch(object_path(obj["kind"], meta["namespace"], meta["name"]), ops)
    return "updated"


async def reconcile(
    api: KubeApi,
    owner: dict,
    spec: dict,
    image: str,
    initial_replicas: int,
    token_secret: str = "",
    vllm_image: str = DEFAULT_VLLM_IMAGE,
) -> dict[str, str]:
    """Bring every owned object to what spec asks; returns object name -> outcome."""
    name, namespace = owner["metadata"]["name"], owner["metadata"]["namespace"]
    objects = [
        resources.deployment(
            owner, spec, image, initial_replicas, "main", token_secret, vllm_image
        ),
        resources.service(owner, spec),
        resources.pod_disruption_budget(owner, spec),
    ]
    if resources.canary_wanted(spec):
        objects.append(
            resources.deployment(owner, spec, image, 1, "canary", token_secret, vllm_image)
        )
        objects.append(resources.service(owner, spec, "canary"))
    outcomes = {}
    for obj in objects:
        outcomes[f"{obj['kind']}/{obj['metadata']['name']}"] = await apply(api, obj)
    if not resources.canary_wanted(spec):
        n = resources.names(name)
        for kind, obj_name in (("Deployment", n["canary"]), ("Service", n["canary_service"])):
            if await api.delete(object_path(kind, namespace, obj_name)):
                outcomes[f"{kind}/{obj_name}"] = "deleted"
    return outcomes


async def delete_owned(api: KubeApi, namespace: str, name: str) -> list[str]:
    """Delete everything owned; the garbage collector would too, this does not wait for it."""
    n = resources.names(name)
    targets = [
        ("Deployment", n["deployment"]),
        ("Deployment", n["canary"]),
        ("Service", n["service"]),
        ("Service", n["canary_service"]),
        ("PodDisruptionBudget", n["pdb"]),
    ]
    deleted = []
    for kind, obj_name in targets:
        if await api.delete(object_path(kind, namespace, obj_name)):
            deleted.append(f"{kind}/{obj_name}")
    return deleted
