"""The operator's Kubernetes calls, through lightkube's AsyncClient.

kopf watches and patches the ModelDeployments; everything else (the owned
objects, pods, claims, the routes ConfigMap) goes through one lightkube
client logged in with the credentials kopf found (kopf.login_via_client), and
replaced when kopf logs in again.

Owned objects are written with server-side apply under the field manager
`maas-operator`, forced: the operator must win over a hand edit of a field it
sets. It never sends a field it does not own (docs/operator.md, "Drift").
The replicas the autoscaler decides go under a manager of their own,
`maas-operator-autoscaler`, so the spec's apply can leave them out.
"""

from dataclasses import dataclass

import httpx2
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import ConfigMap, PersistentVolumeClaim, Pod, Service
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import PatchType

FIELD_MANAGER = "maas-operator"
AUTOSCALER_MANAGER = "maas-operator-autoscaler"
RESOURCES = {
    "Deployment": Deployment,
    "Service": Service,
    "PodDisruptionBudget": PodDisruptionBudget,
    "Pod": Pod,
    "ConfigMap": ConfigMap,
    "PersistentVolumeClaim": PersistentVolumeClaim,
}
TIMEOUT_SECONDS = 30.0


@dataclass
class Credentials:
    """What kopf.login_via_client finds: a server, a token, and file paths."""

    server: str
    token: str | None = None
    ca_path: str | None = None
    insecure: bool = False
    certificate_path: str | None = None
    private_key_path: str | None = None

    @classmethod
    def from_connection_info(cls, info) -> "Credentials":
        return cls(
            server=info.server,
            token=info.token,
            ca_path=info.ca_path,
            insecure=bool(info.insecure),
            certificate_path=info.certificate_path,
            private_key_path=info.private_key_path,
        )

    def config(self) -> KubeConfig:
        return KubeConfig.from_one(
            cluster=Cluster(
                server=self.server, certificate_auth=self.ca_path, insecure=self.insecure
            ),
            user=User(
                token=self.token,
                client_cert=self.certificate_path,
                client_key=self.private_key_path,
            ),
        )


class KubeApi:
    """One lightkube client, rebuilt when kopf logs in again; dicts in and out."""

    def __init__(self, credentials: Credentials):
        self._credentials = credentials
        self._client: AsyncClient | None = None
        self._retired: list[AsyncClient] = []

    def update(self, credentials: Credentials) -> None:
        """New credentials (kopf logged in again); the next call uses them."""
        self._credentials = credentials
        if self._client is not None:
            self._retired.append(self._client)  # calls in flight may still use it
        self._client = None

    @property
    def client(self) -> AsyncClient:
        if self._client is None:
            self._client = AsyncClient(
                self._credentials.config(),
                timeout=httpx2.Timeout(TIMEOUT_SECONDS),
                field_manager=FIELD_MANAGER,
                trust_env=False,
            )
        return self._client

    async def close(self) -> None:
        for client in [*self._retired, *([self._client] if self._client else [])]:
            await client.close()

    async def get(self, kind: str, namespace: str, name: str) -> dict | None:
        try:
            found = await self.client.get(RESOURCES[kind], name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise
        return found.to_dict()

    async def list(self, kind: str, namespace: str, labels: dict[str, str]) -> list[dict]:
        listing = self.client.list(RESOURCES[kind], namespace=namespace, labels=labels)
        return [item.to_dict() async for item in listing]

    async def apply(self, obj: dict, manager: str = FIELD_MANAGER) -> dict:
        """Server-side apply, forced: obj holds exactly the fields this manager owns."""
        meta = obj["metadata"]
        applied = await self.client.patch(
            RESOURCES[obj["kind"]],
            meta["name"],
            obj,
            namespace=meta["namespace"],
            patch_type=PatchType.APPLY,
            field_manager=manager,
            force=True,
        )
        return applied.to_dict()

    async def merge_patch(self, kind: str, namespace: str, name: str, body: dict) -> dict:
        patched = await self.client.patch(
            RESOURCES[kind], name, body, namespace=namespace, patch_type=PatchType.MERGE
        )
        return patched.to_dict()

    async def create(self, obj: dict) -> dict:
        resource = RESOURCES[obj["kind"]]
        created = await self.client.create(resource.from_dict(obj))
        return created.to_dict()

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        """True when something was deleted; a missing object is not an error."""
        try:
            await self.client.delete(RESOURCES[kind], name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return False
            raise
        return True
