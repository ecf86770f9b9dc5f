"""The operator writes each ModelDeployment's gateway routes into its ConfigMap (#17).

The real kopf handlers against kmock's emulator, as in test_operator_kmock.
"""

import pytest
import yaml

from maas_operator.modeldeployment.routes import RoutesConfigMap
from tests.k8s.test_operator_kmock import (
    NAMESPACE,
    create,
    eventually,
    live,
    md,
    model_deployment,
    patch,
    running_cluster,
)

ROUTES = RoutesConfigMap(NAMESPACE, "maas-operator-routes")
KEY = f"{NAMESPACE}.demo.yaml"

pytestmark = pytest.mark.timeout(120)


def routes(emulator) -> dict | None:
    configmap = live(emulator, "v1/configmaps", ROUTES.name)
    text = ((configmap or {}).get("data") or {}).get(KEY)
    return yaml.safe_load(text) if text else None


def canary_weight(emulator) -> int | None:
    fragment = routes(emulator)
    if fragment is None:
        return None
    split = {r["deployment"]: r["weight"] for r in fragment["models"]["chat"]["routes"]}
    return split.get("demo-model-canary", 0)


async def test_aliases_and_canary_weight_follow_the_resource_into_the_routes_configmap():
    async with running_cluster(routes=ROUTES) as (emulator, client, _pool):
        spec = {"aliases": ["chat"], "canary": {"version": "v2", "weight": 10}}
        await create(client, model_deployment(**spec))
        await eventually(lambda: canary_weight(emulator) == 10, what="the canary route")
        fragment = routes(emulator)
        assert set(fragment["models"]) == {"demo-model", "chat"}
        assert fragment["deployments"] == {"demo-model-canary": {"tokenizer": "demo-model"}}
        service = await eventually(
            lambda: live(emulator, "v1/services", "demo-engine-canary"), what="canary Service"
        )
        assert service["metadata"]["labels"]["maas.io/model"] == "demo-model-canary"

        await patch(client, {"spec": {"canary": {"weight": 40}}})
        await eventually(lambda: canary_weight(emulator) == 40, what="the new weight")

        response = await client.delete(
            f"/apis/maas.io/v1alpha1/namespaces/{NAMESPACE}/modeldeployments/demo"
        )
        assert response.status == 200
        await eventually(lambda: md(emulator) is None, what="the finalizer to be released")
        assert routes(emulator) is None
        assert live(emulator, "v1/services", "demo-engine-canary") is None
