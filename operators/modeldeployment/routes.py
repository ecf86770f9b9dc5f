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
    adapters:            # spec.adapters, each served by the main deployment's engines
      sql-upper: {deployment: smollm2, source: /models/store/adapters/sql-upper,
                  tenants: [acme], load: on-demand}     # no tenants: every tenant

Each write is a merge patch of that one key (keyed_configmap.py), so two
ModelDeployments never overwrite each other's routes; deleting the resource
patches its key to null. The gateway watches the ConfigMap through
the API (services/gateway/routing/routes_configmap.py), so a weight change reaches
traffic within seconds.
"""

from dataclasses import dataclass

import yaml

from maas_operator.modeldeployment.adapter_spec import Adapter, adapters
from maas_operator.modeldeployment.keyed_configmap import KeyedConfigMap
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
    table = {
        "models": {alias: {"routes": routes} for alias in names},
        "deployments": {d: options for d, options in deployments.items() if options},
    }
    served = {a.name: _adapter_route(main, a) for a in adapters(spec)}
    if served:
        table["adapters"] = served
    return table


def _adapter_route(deployment: str, adapter: Adapter) -> dict:
    route = {"deployment": deployment, "source": adapter.path, "load": adapter.load}
    if adapter.tenants:
        route["tenants"] = list(adapter.tenants)
    return route


def key(namespace: str, name: str) -> str:
    return f"{namespace}.{name}.yaml"


@dataclass(frozen=True)
class RoutesConfigMap:
    namespace: str
    name: str

    async def publish(self, api: KubeApi, owner_namespace: str, owner: str, spec: dict) -> None:
        text = yaml.safe_dump(fragment(owner, spec), sort_keys=True)
        await self._configmap.put(api, key(owner_namespace, owner), text)

    async def withdraw(self, api: KubeApi, owner_namespace: str, owner: str) -> None:
        await self._configmap.remove(api, key(owner_namespace, owner))

    @property
    def _configmap(self) -> KeyedConfigMap:
        return KeyedConfigMap(self.namespace, self.name)
