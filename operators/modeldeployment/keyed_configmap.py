"""A ConfigMap whose keys belong to different ModelDeployments, one key each.

Each write is a merge patch of one key, so two ModelDeployments never
overwrite each other's and no read-modify-write races; removing a key patches
it to null. The first write creates the ConfigMap. One name per ConfigMap, so
the operator's rights to ConfigMaps name it (charts/maas/templates/rbac.yaml).
"""

from dataclasses import dataclass

from lightkube import ApiError

from maas_operator.modeldeployment.kube import KubeApi


@dataclass(frozen=True)
class KeyedConfigMap:
    namespace: str
    name: str

    async def put(self, api: KubeApi, key: str, text: str) -> None:
        await self._patch(api, {key: text})

    async def remove(self, api: KubeApi, key: str) -> None:
        await self._patch(api, {key: None})

    async def _patch(self, api: KubeApi, data: dict) -> None:
        try:
            await api.merge_patch("ConfigMap", self.namespace, self.name, {"data": data})
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            if all(v is None for v in data.values()):
                return  # nothing to remove from a ConfigMap that is not there
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
