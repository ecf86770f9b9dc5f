"""The operator's routes ConfigMap, kept current by an informer through the API.

A mounted ConfigMap reaches the pod a minute or two after a change; a watch
sees it within a second, so a canary weight the operator writes moves traffic
at once. The watch is an informer (maas_services.common.kube_informer: list +
watch on lightkube's async client in the gateway's event loop, relist on 410
Gone, jittered backoff on errors), so a dropped watch loses nothing. Only the
one ConfigMap is asked for (a fieldSelector on its name), which is what a
Role with resourceNames allows: get, list and watch of that name.
"""

import asyncio
import contextlib
from collections.abc import Callable

from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap

from maas_services.common.kube_client import async_client
from maas_services.common.kube_informer import Informer

OnData = Callable[[dict[str, str]], None]


class RoutesConfigMapWatch:
    def __init__(self, client: AsyncClient, namespace: str, name: str):
        self._client = client
        self._name = name
        self._informer = Informer(
            client,
            ConfigMap,
            namespace,
            fields={"metadata.name": name},
            name="routes-configmap",
        )
        self._task: asyncio.Task | None = None

    @classmethod
    def from_settings(cls, settings) -> "RoutesConfigMapWatch | None":
        """From GatewaySettings; None when no ConfigMap is named."""
        if not settings.routes_configmap:
            return None
        client = async_client(settings.kubeconfig)
        # The client's namespace: the pod's own in a cluster, the kubeconfig's outside.
        namespace = settings.routes_configmap_namespace or client.namespace
        return cls(client, namespace, settings.routes_configmap)

    def start(self, on_data: OnData) -> None:
        """on_data(data) runs on the calling event loop after each change ({} when absent)."""

        delivered: list[dict[str, str]] = []

        def changed() -> None:
            # Picked by name: a server that ignored the field selector sends others too.
            found = self._informer.objects.get((self._informer.namespace, self._name))
            data = (found or {}).get("data") or {}
            if delivered != [data]:
                delivered[:] = [data]
                on_data(data)

        self._task = asyncio.get_running_loop().create_task(self._informer.run(changed))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._client.close()
