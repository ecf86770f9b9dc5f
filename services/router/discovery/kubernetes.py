"""Kubernetes discovery: watch the engine Services and EndpointSlices of the
namespaces the operator manages (the same list), or of every namespace.

The `kubernetes` client is synchronous, so each resource of each namespace is
listed and watched in its own daemon thread, which wakes the event loop after
every change; the loop then rebuilds the whole snapshot from all caches. Every
watch round starts with a fresh list, so a dropped watch (or a 410 Gone) can't
leave a deleted pod behind. The ModelDeployments of the same namespaces are
watched too: a Service is pooled only when one of them owns it
(discovery/ownership.py). RBAC: list/watch on services, discovery.k8s.io
endpointslices and maas.io modeldeployments, in a Role per namespace or, for
every namespace, a ClusterRole.
"""

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable
from functools import partial

from kubernetes import client, watch

from maas_services.common.kubernetes_client import api_client
from maas_services.common.logging import get_logger
from maas_services.router.discovery import Snapshot
from maas_services.router.discovery.kubernetes_objects import snapshot_of
from maas_services.router.discovery.ownership import OwnerCheck
from maas_services.router.settings import RouterSettings

log = get_logger(__name__)

# The ModelDeployment resource, as the operator serves it (operators/modeldeployment/crd_schema.py).
MD_GROUP, MD_VERSION, MD_PLURAL = "maas.io", "v1alpha1", "modeldeployments"
# The server ends a watch after this long; the next round relists.
WATCH_SECONDS = 300
RETRY_SECONDS = 2.0


class _ResourceCache:
    """One resource kind's objects in a namespace (or all), kept current by list + watch."""

    def __init__(self, list_fn: Callable, args: tuple, selector: str):
        self._list_fn = list_fn
        self._args = args  # (namespace,) for a namespaced list, () for every namespace
        self._selector = selector
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str], dict] = {}
        self._stopped = threading.Event()
        self._watch: watch.Watch | None = None
        self.synced = threading.Event()

    def objects(self) -> list[dict]:
        with self._lock:
            return list(self._objects.values())

    def start(self, on_change: Callable[[], None]) -> None:
        threading.Thread(target=self._run, args=(on_change,), name="k8s-watch", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        if self._watch is not None:
            self._watch.stop()

    def _run(self, on_change: Callable[[], None]) -> None:
        while not self._stopped.is_set():
            try:
                version = self._relist()
                self.synced.set()
                on_change()
                self._watch = watch.Watch()
                for event in self._watch.stream(
                    self._list_fn,
                    *self._args,
                    label_selector=self._selector,
                    resource_version=version,
                    timeout_seconds=WATCH_SECONDS,
                ):
                    if self._apply(event["type"], event["raw_object"]):
                        on_change()
            except Exception as exc:  # the API server going away must not end discovery
                if self._stopped.is_set():
                    return
                log.warning("kubernetes_watch_failed", error=str(exc)[:300])
                self._stopped.wait(RETRY_SECONDS)

    def _relist(self) -> str:
        response = self._list_fn(*self._args, label_selector=self._selector, _preload_content=False)
        listing = json.loads(response.data)
        with self._lock:
            self._objects = {_key(item): item for item in listing["items"]}
        return listing["metadata"].get("resourceVersion", "")

    def _apply(self, kind: str, obj: dict) -> bool:
        named = bool((obj.get("metadata") or {}).get("name"))
        if kind not in ("ADDED", "MODIFIED", "DELETED") or not named:
            return False  # BOOKMARK, or nothing to key it by
        with self._lock:
            if kind == "DELETED":
                self._objects.pop(_key(obj), None)
            else:
                self._objects[_key(obj)] = obj
        return True


def _key(obj: dict) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


class KubernetesSource:
    def __init__(self, api: client.ApiClient, namespaces: list[str], service_selector: str):
        core, discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
        custom = client.CustomObjectsApi(api)
        if namespaces:
            scopes = [(ns,) for ns in dict.fromkeys(namespaces)]
            list_services, list_slices = (
                core.list_namespaced_service,
                discovery.list_namespaced_endpoint_slice,
            )

            def list_deployments(namespace: str, **kwargs):
                # The namespace sits between version and plural in this call.
                return custom.list_namespaced_custom_object(
                    MD_GROUP, MD_VERSION, namespace, MD_PLURAL, **kwargs
                )
        else:
            scopes = [()]
            list_services, list_slices = (
                core.list_service_for_all_namespaces,
                discovery.list_endpoint_slice_for_all_namespaces,
            )
            list_deployments = partial(
                custom.list_cluster_custom_object, MD_GROUP, MD_VERSION, MD_PLURAL
            )
        self._services = [_ResourceCache(list_services, s, service_selector) for s in scopes]
        # A slice names its Service in a label; rather than rely on it copying the
        # Service's other labels, every slice is read and joined by namespace and name.
        self._slices = [_ResourceCache(list_slices, s, "") for s in scopes]
        self._deployments = [_ResourceCache(list_deployments, s, "") for s in scopes]
        self._owners = OwnerCheck()

    @classmethod
    def from_settings(cls, settings: RouterSettings) -> "KubernetesSource":
        return cls(
            api_client(settings.kubeconfig),
            settings.kubernetes_namespaces,
            settings.kubernetes_selector,
        )

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()
        caches = self._services + self._slices + self._deployments
        for cache in caches:
            cache.start(lambda: loop.call_soon_threadsafe(changed.set))
        while True:
            await changed.wait()
            changed.clear()
            # Half-synced state would look like "every replica is gone".
            if all(cache.synced.is_set() for cache in caches):
                services = [obj for cache in self._services for obj in cache.objects()]
                slices = [obj for cache in self._slices for obj in cache.objects()]
                owners = [obj for cache in self._deployments for obj in cache.objects()]
                yield snapshot_of(self._owners.pooled(services, owners), slices)

    async def close(self) -> None:
        for cache in self._services + self._slices + self._deployments:
            cache.stop()
