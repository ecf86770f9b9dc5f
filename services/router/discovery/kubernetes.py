"""Kubernetes discovery: watch the engine Services and EndpointSlices of the
namespaces the operator manages (the same list), or of every namespace.

Each resource of each namespace is an informer (maas_services.common.kube_informer:
list + watch on lightkube's async client, relist on 410 Gone, jittered
backoff on errors) in the router's own event loop; after every change the
whole snapshot is rebuilt from all caches. The ModelDeployments of the same
namespaces are watched too: a Service is pooled only when one of them owns it
(discovery/ownership.py). RBAC: list/watch on services, discovery.k8s.io
endpointslices and maas.io modeldeployments, in a Role per namespace or, for
every namespace, a ClusterRole.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator

from lightkube import AsyncClient, operators
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Service
from lightkube.resources.discovery_v1 import EndpointSlice

from maas_services.common.kube_client import async_client
from maas_services.common.kube_informer import Informer
from maas_services.router.discovery import Snapshot
from maas_services.router.discovery.kubernetes_objects import snapshot_of
from maas_services.router.discovery.ownership import OwnerCheck
from maas_services.router.settings import RouterSettings

# The ModelDeployment resource, as the operator serves it (operators/modeldeployment/crd_schema.py).
ModelDeployment = create_namespaced_resource(
    "maas.io", "v1alpha1", "ModelDeployment", "modeldeployments"
)


def label_selector(selector: str) -> dict[str, object] | None:
    """A label selector string (`a=b,c!=d,e,!f`) as lightkube's labels argument.

    Set-based terms (`in`, `notin`) are not taken: the chart never writes them.
    """
    labels: dict[str, object] = {}
    for term in (t.strip() for t in selector.split(",") if t.strip()):
        if "!=" in term:
            key, value = term.split("!=", 1)
            labels[key.strip()] = operators.not_equal(value.strip())
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            labels[key.strip()] = value.strip()
        elif term.startswith("!"):
            labels[term[1:].strip()] = operators.not_exists()
        else:
            labels[term] = operators.exists()
    return labels or None


class KubernetesSource:
    def __init__(self, client: AsyncClient, namespaces: list[str], service_selector: str):
        self._client = client
        scopes = list(dict.fromkeys(namespaces)) or [""]  # "": every namespace
        labels = label_selector(service_selector)
        self._services = [
            Informer(client, Service, ns, labels=labels, name="services") for ns in scopes
        ]
        # A slice names its Service in a label; rather than rely on it copying the
        # Service's other labels, every slice is read and joined by namespace and name.
        self._slices = [Informer(client, EndpointSlice, ns, name="endpointslices") for ns in scopes]
        self._deployments = [
            Informer(client, ModelDeployment, ns, name="modeldeployments") for ns in scopes
        ]
        self._owners = OwnerCheck()
        self._tasks: list[asyncio.Task] = []

    @classmethod
    def from_settings(cls, settings: RouterSettings) -> "KubernetesSource":
        return cls(
            async_client(settings.kubeconfig),
            settings.kubernetes_namespaces,
            settings.kubernetes_selector,
        )

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        changed = asyncio.Event()
        informers = self._services + self._slices + self._deployments
        self._tasks = [asyncio.create_task(i.run(changed.set)) for i in informers]
        while True:
            await changed.wait()
            changed.clear()
            # Half-synced state would look like "every replica is gone".
            if all(informer.synced.is_set() for informer in informers):
                services = [obj for i in self._services for obj in i.objects.values()]
                slices = [obj for i in self._slices for obj in i.objects.values()]
                owners = [obj for i in self._deployments for obj in i.objects.values()]
                yield snapshot_of(self._owners.pooled(services, owners), slices)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._client.close()
