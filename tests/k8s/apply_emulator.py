"""The tests' API server: StampingEmulator plus server-side apply and faults to order.

kmock stores what it is sent and has no server-side apply. This subclass
answers PATCH application/apply-patch+yaml by field_ownership.py's rules
(managedFields per manager, 409 on a conflict unless forced, fields a
manager stops applying removed when nobody else owns them), records which
manager every other write moved fields to, shows it all in
metadata.managedFields, and sends the watch events a real server would: ADDED
for an apply that creates, MODIFIED for one that changes something (its
managedFields included), none for one that changes nothing (nor a new
resourceVersion).

Faults, as a flaky API server gives them: `expire_watches()` ends the open
watches with a 410 Gone ERROR event in place of their next event (which is
lost: only a relist finds that change), as etcd compaction does;
`outage(status, seconds, token)` answers every request of one client with that
status for a while.
"""

import copy
import time
from dataclasses import dataclass

import attrs
import kmock

from tests.k8s.emulator import StampingEmulator
from tests.k8s.field_ownership import ApplyConflict, Managed

APPLY = "application/apply-patch"
GONE = {
    "type": "ERROR",
    "object": {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": 410,
        "reason": "Expired",
        "message": "too old resource version",
    },
}


def merge_patch(old: dict, new: dict) -> dict:
    """The RFC 7386 merge patch that turns old into new (lists replaced whole)."""
    patch = {k: None for k in old if k not in new}
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(old.get(key), dict):
            inner = merge_patch(old[key], value)
            if inner:
                patch[key] = inner
        elif old.get(key, object()) != value:
            patch[key] = value
    return patch


def _manager(request) -> str:
    """The fieldManager a write names, else its User-Agent's product, as the server does."""
    agent = request.headers.get("User-Agent", "")
    return request.params.get("fieldManager") or agent.split("/")[0] or "unknown"


@dataclass
class _Outage:
    status: int
    until: float
    token: str


class ApplyingEmulator(StampingEmulator):
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # (resource, namespace, name) -> Managed: each object's managedFields.
        self.managed: dict[tuple, Managed] = {}
        self._expired = 0  # how many times watches were ended with 410
        self._outage: _Outage | None = None

    def expire_watches(self) -> None:
        """Open watches end with 410 Gone in place of their next event."""
        self._expired += 1

    def outage(self, status: int, seconds: float, token: str) -> None:
        """Every request carrying this bearer token is answered `status` for a while."""
        self._outage = _Outage(status, time.monotonic() + seconds, token)

    async def _render_error(self, exc):
        # The API server's Status comes as plain application/json (aiohttp adds a
        # charset), which is what clients such as lightkube look for.
        response = await super()._render_error(exc)
        response.charset = None
        return response

    def _live(self, key) -> dict | None:
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    async def _serve_watch(self, request):
        expired = self._expired
        async for item in super()._serve_watch(request):
            if self._expired != expired:
                yield GONE
                return
            yield item

    async def _handle(self, request):
        managed, outage = self.managed, self._outage
        authorization = request.headers.get("Authorization", "")
        if outage and time.monotonic() < outage.until and authorization == f"Bearer {outage.token}":
            raise kmock.KubernetesError(status=outage.status, reason="InternalError")
        if request.resource is None or request.subresource is not None:
            return await super()._handle(request)
        key = (request.resource, request.namespace, request.name)
        content_type = request.headers.get("Content-Type", "")
        if request.method.value == "PATCH" and content_type.startswith(APPLY):
            return await self._apply(request, key, managed.setdefault(key, Managed()))
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            name = request.data.get("metadata", {}).get("name")
            key = (request.resource, request.namespace, name)
        before = self._live(key)
        response = await super()._handle(request)
        if request.action == kmock.action.DELETE:
            managed.pop(key, None)
        elif request.action in (kmock.action.CREATE, kmock.action.UPDATE):
            after = self._live(key)
            if after is not None:
                owners = managed.setdefault(key, Managed())
                owners.updated(before, after, _manager(request))
                # kmock's versions share their nested dicts: this shows in the version just
                # written (the response already went out without it).
                self.objects[key].raw["metadata"]["managedFields"] = owners.fields_v1()
        return response

    async def _apply(self, request, key, managed: Managed):
        manager = request.params.get("fieldManager")
        if not manager:
            raise kmock.KubernetesError(
                status=422, reason="Invalid", message="fieldManager is required for apply"
            )
        live = self._live(key)
        try:
            wanted = managed.applied(
                live, request.data, manager, request.params.get("force") == "true"
            )
        except ApplyConflict as exc:
            raise kmock.KubernetesError(status=409, reason="Conflict", message=str(exc)) from exc
        wanted.setdefault("metadata", {})["managedFields"] = managed.fields_v1()
        if live is None:
            wanted.update(apiVersion=request.data.get("apiVersion"), kind=request.data.get("kind"))
            wanted.setdefault("metadata", {}).update(name=request.name)
            served = attrs.evolve(
                request, method="POST", action=kmock.action.CREATE, name=None, data=wanted
            )
        elif (patch := merge_patch(live, wanted)) != {}:
            served = attrs.evolve(request, data=patch)
        else:  # nothing changed: no new version, no watch event
            served = attrs.evolve(request, method="GET", action=kmock.action.FETCH, data=None)
        # kmock serves only requests in its log; this one stands for the apply there.
        self._requests.append(served)
        return await super()._handle(served)
