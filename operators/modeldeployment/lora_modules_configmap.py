"""The preload adapters each engine starts with, from a ConfigMap rather than its pod.

A replica reads its ModelDeployment's preload adapters once, as it starts
(MAAS_LORA_MODULES, the engine's --lora-modules setting: a JSON list of
NAME=PATH), and loads them before it reports ready. They are not in the pod
template: a change of them would be a new template, and every replica would
restart; instead the running replicas get a change by LoadAdapter
(adapter_sync.py) and the replicas that start later read it here.

One ConfigMap per namespace, a key per ModelDeployment (its name), written as
the routes are (keyed_configmap.py): the operator's rights to ConfigMaps name it.
The reference is optional: a replica that starts while it is missing gets its
adapters by LoadAdapter instead.
"""

import json

from maas_operator.modeldeployment.adapter_spec import lora_modules, lora_wanted
from maas_operator.modeldeployment.keyed_configmap import KeyedConfigMap
from maas_operator.modeldeployment.kube import KubeApi

NAME = "maas-engine-adapters"


def lora_modules_env(owner: str, spec: dict) -> list[dict]:
    """The engine container's MAAS_LORA_MODULES, when the spec serves adapters."""
    if not lora_wanted(spec):
        return []
    ref = {"name": NAME, "key": owner, "optional": True}
    return [{"name": "MAAS_LORA_MODULES", "valueFrom": {"configMapKeyRef": ref}}]


async def publish(api: KubeApi, namespace: str, owner: str, spec: dict) -> None:
    if lora_wanted(spec):
        await KeyedConfigMap(namespace, NAME).put(api, owner, json.dumps(lora_modules(spec)))
    else:
        await withdraw(api, namespace, owner)


async def withdraw(api: KubeApi, namespace: str, owner: str) -> None:
    """Remove owner's key if it is there: most ModelDeployments never had one, and a
    read costs less than a write to every reconcile of theirs."""
    found = await api.get("ConfigMap", namespace, NAME)
    if found is not None and owner in (found.get("data") or {}):
        await KeyedConfigMap(namespace, NAME).remove(api, owner)
