"""The gateway routes a ModelDeployment asks for, in a ConfigMap of the operator's.

Not the chart's routes ConfigMap: `helm upgrade` would overwrite what the
operator wrote there. Each ModelDeployment owns one key, `<namespace>.<name>.yaml`,
holding a fragment of the gateway's routing table (services/gateway/routing/routing_table.py):

    models:              # the model id and every spec.aliases name
      smollm2:
        routes: [{deployment: smollm2, weight: 90}, {deployment: smollm2-canary, weight: 10}]
    deployments:
      smollm2: {scales_to_zero: true}           # replicas.min 0: hold, do not refuse
      smollm2-canary: {tokenizer: smollm2}      # the canary speaks the main model's vocabulary

Each write is a merge patch of that one key, so two ModelDeployments never
overwrite each other's routes and no read-modify-write races; deleting the
resource patches its key to null. The gateway watches the ConfigMap through
the API (services/gateway/routing/routes_configmap.py), so a weight change reaches
traffic within seconds.
"""

from dataclasses import dataclass

import yaml
from lightkube import ApiError

from maas_operator.modeldeployment.kube import KubeApi
from maas_operator.modeldeployment.resources import canary_wanted
from maas_operator.modeldeployment.spec import canary_model_id, model_id


def fragment(name: str, spec: dict) -> dict:
    """The routing-table fragment of one (defaulted) ModelDeployment spec."""
    main = model_id(name, spec)
    weight = spec["canary"]["weight"] if canary_wanted(spec) else 0
    routes = [{"deployment": main, "weight": 100 - weight}] if weight < 100 else []
    deployments: dict[str, dict] = {main: {}}
    if weight:
        canary = canary_model_id(name, spec)
        routes.append({"deployment": canary, "weight": weight})
        deployments[canary] = {"tokenizer": main}
    if spec["replicas"]["min"] == 0:
        deployments[main]["scales_to_zero"] = True
    names = [main, *(a for a in spec.get("aliases") or [] if a != main)]
    return {
        "models": {alias: {"routes": routes} for alias in names},
        "deployments": {d: options for d, options in deployments.items() if options},
    }


def key(namespace: str, name: str) -> str:
    return f"{namespace}.{name}.yaml"


@dataclass(frozen=True)
class RoutesConfigMap:
    namespace: str
    name: str

    async def publish(self, api: KubeApi, owner_namespace: str, owner: str, spec: dict) -> None:
        text = yaml.safe_dump(fragment(owner, spec), sort_keys=True)
        await self._patch(api, {key(owner_namespace, owner): text})

    async def withdraw(self, api: KubeApi, owner_namespace: str, owner: str) -> None:
        await self._patch(api, {key(owner_namespace, owner): None})

    async def _patch(self, api: KubeApi, data: dict) -> None:
        try:
            await api.merge_patch("ConfigMap", self.namespace, self.name, {"data": data})
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            if all(v is None for v in data.values()):
                return  # nothing to withdraw from a ConfigMap that is not there
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    "labels": {"app.kubernetes.io/managed-by": "maas-operator"},
                },
                "data": {k: v for k, v in data.items() if v is not None},
            }
            try:
                await api.create(body)
            except ApiError as race:
                if race.status.code != 409:  # another writer created it first: patch that one
                    raise
                await api.merge_patch("ConfigMap", self.namespace, self.name, {"data": data})
