"""The operator's routes ConfigMap, kept current by list + watch through the API.

A mounted ConfigMap reaches the pod a minute or two after a change; a watch
sees it within a second, so a canary weight the operator writes moves traffic
at once. The `kubernetes` client is synchronous: the list and the watch run in
a daemon thread that hands each new `data` to the event loop. Every round
starts with a fresh list, so a dropped watch (or 410 Gone) loses nothing. Only
the one ConfigMap is asked for (a fieldSelector on its name), which is what a
Role with resourceNames allows: get, list and watch of that name.
"""

import asyncio
import json
import threading
from collections.abc import Callable

from kubernetes import client, watch

from maas_services.common.kubernetes_client import api_client, own_namespace
from maas_services.common.logging import get_logger

log = get_logger(__name__)

WATCH_SECONDS = 300  # the server ends a watch after this long; the next round relists
RETRY_SECONDS = 2.0

OnData = Callable[[dict[str, str]], None]


class RoutesConfigMapWatch:
    def __init__(self, api: client.ApiClient, namespace: str, name: str):
        self._list = client.CoreV1Api(api).list_namespaced_config_map
        self._namespace = namespace
        self._name = name
        self._stopped = threading.Event()
        self._watch: watch.Watch | None = None

    @classmethod
    def from_settings(cls, settings) -> "RoutesConfigMapWatch | None":
        """From GatewaySettings; None when no ConfigMap is named."""
        if not settings.routes_configmap:
            return None
        namespace = settings.routes_configmap_namespace or own_namespace()
        return cls(api_client(settings.kubeconfig), namespace, settings.routes_configmap)

    def start(self, on_data: OnData) -> None:
        """on_data(data) runs on the calling event loop after each change ({} when absent)."""
        loop = asyncio.get_running_loop()

        def deliver(data: dict[str, str]) -> None:
            loop.call_soon_threadsafe(on_data, data)

        threading.Thread(
            target=self._run, args=(deliver,), name="routes-watch", daemon=True
        ).start()

    def stop(self) -> None:
        self._stopped.set()
        if self._watch is not None:
            self._watch.stop()

    def _mine(self, obj: dict) -> bool:
        return (obj.get("metadata") or {}).get("name") == self._name

    def _run(self, deliver: Callable[[dict[str, str]], None]) -> None:
        selector = f"metadata.name={self._name}"
        while not self._stopped.is_set():
            try:
                response = self._list(
                    self._namespace, field_selector=selector, _preload_content=False
                )
                listing = json.loads(response.data)
                found = [item for item in listing["items"] if self._mine(item)]
                deliver((found[0].get("data") or {}) if found else {})
                self._watch = watch.Watch()
                for event in self._watch.stream(
                    self._list,
                    self._namespace,
                    field_selector=selector,
                    resource_version=listing["metadata"].get("resourceVersion", ""),
                    timeout_seconds=WATCH_SECONDS,
                ):
                    obj = event["raw_object"]
                    if event["type"] not in ("ADDED", "MODIFIED", "DELETED") or not self._mine(obj):
                        continue  # BOOKMARK, or a server that ignored the selector
                    deliver({} if event["type"] == "DELETED" else obj.get("data") or {})
            except Exception as exc:  # the API server going away must not end the watch
                if self._stopped.is_set():
                    return
                log.warning("routes_configmap_watch_failed", error=str(exc)[:300])
                self._stopped.wait(RETRY_SECONDS)
