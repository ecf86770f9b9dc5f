"""An informer: one kind of Kubernetes object kept as a local cache by list + watch.

What client-go's informers do, on lightkube's async client, in the service's
own event loop (no threads):
- list, then watch from the list's resourceVersion, so no change between the
  two is lost; lightkube resumes a watch the server ended from the last
  version it saw;
- a 410 Gone (the version is older than the server keeps: etcd compacted it)
  means changes were lost: list again at once, replacing the whole cache, so a
  deleted object cannot linger;
- any other failure (the API server restarting, 500s, a dropped connection)
  waits a jittered exponential backoff (tenacity's wait_exponential_jitter)
  and lists again: replicas that lost the server together do not come back in
  step. The backoff starts over once a watch has run for a while.

Selectors go to the server; the emulator in the tests ignores them, so
callers still check what they are given.
"""

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.core.generic_client import ALL_NS
from tenacity import AsyncRetrying, retry_if_exception, wait_exponential_jitter

from maas_services.common.logging import get_logger

log = get_logger(__name__)

# The server ends a watch after this long; lightkube reopens it from the last version.
WATCH_SECONDS = 300
INITIAL_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 30.0
# Added at random to each wait: replicas that failed together retry apart.
JITTER_SECONDS = 1.0
# A watch that ran this long was healthy: its failure starts the backoff over.
HEALTHY_SECONDS = 10.0


def _gone(exc: BaseException) -> bool:
    return isinstance(exc, ApiError) and exc.status.code == 410


def _transient(exc: BaseException) -> bool:
    """Worth listing again after a wait: any API or connection error but 410."""
    return isinstance(exc, httpx2.HTTPError | OSError) and not _gone(exc)


class Relist(Exception):
    """The watch lost changes (410 Gone) or ended after running well: list again now."""


def key_of(obj: dict) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


@dataclass
class Informer:
    client: AsyncClient
    resource: type
    namespace: str = ""  # empty: every namespace
    labels: dict[str, object] | None = None
    fields: dict[str, object] | None = None
    name: str = ""  # for the logs
    objects: dict[tuple[str, str], dict] = field(default_factory=dict)
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    relists: int = 0

    async def run(self, on_change: Callable[[], None]) -> None:
        """Forever: keep objects current, calling on_change after every change."""
        while True:
            retrying = AsyncRetrying(
                wait=wait_exponential_jitter(
                    multiplier=INITIAL_BACKOFF_SECONDS,
                    max=MAX_BACKOFF_SECONDS,
                    jitter=JITTER_SECONDS,
                ),
                retry=retry_if_exception(_transient),
                before_sleep=self._log_retry,
            )
            try:
                await retrying(self._list_and_watch, on_change)
            except Relist:
                continue

    def _log_retry(self, state) -> None:
        log.warning(
            "kubernetes_watch_failed",
            resource=self.name or self.resource.__name__,
            attempt=state.attempt_number,
            error=str(state.outcome.exception())[:300],
        )

    async def _list_and_watch(self, on_change: Callable[[], None]) -> None:
        namespace = self.namespace or ALL_NS
        listing = self.client.list(
            self.resource, namespace=namespace, labels=self.labels, fields=self.fields
        )
        objects = {}
        async for item in listing:
            obj = item.to_dict()
            objects[key_of(obj)] = obj
        self.objects = objects
        self.relists += 1
        self.synced.set()
        on_change()
        started = time.monotonic()
        try:
            async for kind, item in self.client.watch(
                self.resource,
                namespace=namespace,
                labels=self.labels,
                fields=self.fields,
                resource_version=listing.resourceVersion,
                server_timeout=WATCH_SECONDS,
            ):
                if self._apply(kind, item.to_dict()):
                    on_change()
        except (httpx2.HTTPError, OSError) as exc:
            if _gone(exc):
                log.info("kubernetes_watch_expired", resource=self.name, error=str(exc)[:200])
                raise Relist from exc
            if time.monotonic() - started > HEALTHY_SECONDS:
                log.warning("kubernetes_watch_ended", resource=self.name, error=str(exc)[:300])
                raise Relist from exc
            raise

    def _apply(self, kind: str, obj: dict) -> bool:
        if kind not in ("ADDED", "MODIFIED", "DELETED") or not obj.get("metadata", {}).get("name"):
            return False  # BOOKMARK, or nothing to key it by
        if kind == "DELETED":
            self.objects.pop(key_of(obj), None)
        else:
            self.objects[key_of(obj)] = obj
        return True
