"""Create, update and delete the objects a ModelDeployment owns, by server-side apply.

Every owned object is applied whole, forced, under the field manager
`maas-operator` (kube.py): the API server restores any field a person or a
controller changed that the operator sets, recreates a deleted object, and
removes a field the spec no longer asks for, while leaving alone fields the
operator does not set (a controller's annotations, an HPA's replicas). The
outcome (created, updated: drift repaired or spec rolled out, or unchanged)
is told by comparing the object read before the apply with the one the apply
returns, less what the server keeps for itself. Not by the resourceVersion:
the API server also writes an object when only its managedFields change.

The main Deployment's replicas are the autoscaler's: the first apply, which
creates the Deployment, carries the starting count and hands it at once to
the autoscaler's own field manager; later applies leave replicas out, so they
never undo a scale.
"""

from maas_operator.modeldeployment import lora_modules_configmap, resources
from maas_operator.modeldeployment.kube import AUTOSCALER_MANAGER, KubeApi
from maas_operator.modeldeployment.vllm_pod import DEFAULT_VLLM_IMAGE

# Written by the server on its own account (a status, a new version, the field managers).
SERVER_METADATA = ("resourceVersion", "generation", "managedFields")


def content(obj: dict) -> dict:
    """An object less its status and the metadata the server keeps."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in SERVER_METADATA}
    return {**{k: v for k, v in obj.items() if k != "status"}, "metadata": meta}


async def apply(api: KubeApi, obj: dict, autoscaled: bool = False) -> str:
    """'created', 'updated' or 'unchanged'. autoscaled: replicas belong to the autoscaler."""
    meta = obj["metadata"]
    current = await api.get(obj["kind"], meta["namespace"], meta["name"])
    if current is not None and autoscaled:
        obj = {**obj, "spec": {k: v for k, v in obj["spec"].items() if k != "replicas"}}
    applied = await api.apply(obj)
    if current is None:
        if autoscaled:
            replicas = {
                "apiVersion": obj["apiVersion"],
                "kind": obj["kind"],
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                "spec": {"replicas": obj["spec"]["replicas"]},
            }
            await api.apply(replicas, manager=AUTOSCALER_MANAGER)
        return "created"
    return "unchanged" if content(current) == content(applied) else "updated"


def owned_objects(
    owner: dict,
    spec: dict,
    image: str,
    initial_replicas: int,
    token_secret: str = "",
    vllm_image: str = DEFAULT_VLLM_IMAGE,
) -> list[tuple[dict, bool]]:
    """Every object spec asks for, each with whether the autoscaler owns its replicas."""
    objects = [
        (
            resources.deployment(
                owner, spec, image, initial_replicas, "main", token_secret, vllm_image
            ),
            True,
        ),
        (resources.service(owner, spec), False),
        (resources.pod_disruption_budget(owner, spec), False),
    ]
    if resources.canary_wanted(spec):
        canary = resources.deployment(owner, spec, image, 1, "canary", token_secret, vllm_image)
        objects += [(canary, False), (resources.service(owner, spec, "canary"), False)]
    return objects


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
    # First: a replica reads its preload adapters there as it starts.
    await lora_modules_configmap.publish(api, namespace, name, spec)
    outcomes = {}
    for obj, autoscaled in owned_objects(
        owner, spec, image, initial_replicas, token_secret, vllm_image
    ):
        outcomes[f"{obj['kind']}/{obj['metadata']['name']}"] = await apply(api, obj, autoscaled)
    if not resources.canary_wanted(spec):
        n = resources.names(name)
        for kind, obj_name in (("Deployment", n["canary"]), ("Service", n["canary_service"])):
            if await api.delete(kind, namespace, obj_name):
                outcomes[f"{kind}/{obj_name}"] = "deleted"
    return outcomes


async def delete_owned(api: KubeApi, namespace: str, name: str) -> list[str]:
    """Delete everything owned; the garbage collector would too, this does not wait for it."""
    await lora_modules_configmap.withdraw(api, namespace, name)
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
        if await api.delete(kind, namespace, obj_name):
            deleted.append(f"{kind}/{obj_name}")
    return deleted
