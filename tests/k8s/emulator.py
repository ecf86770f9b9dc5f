"""kmock's KubernetesEmulator, plus what a real API server does that kopf needs.

kopf relies on names from generateName (its Events), uid (owner references),
resourceVersion (it waits to see its own patches come back on the watch) and
generation (observedGeneration); the emulator stores objects as sent, so this
subclass stamps those on the way in. It also answers a failed JSON-patch test
with 422, and does not replay old objects to a watch that asks for changes
since a version.
"""

import itertools
import uuid
from datetime import UTC, datetime

import jsonpatch
import kmock

_versions = itertools.count(1)
_latest = {"version": 0}


def _touches_spec(patch) -> bool:
    if isinstance(patch, dict):
        return "spec" in patch
    return any(op.get("path", "").startswith("/spec") for op in patch)


class StampingEmulator(kmock.KubernetesEmulator):
    async def _serve_list(self, request):
        # The list's version is where a following watch starts (kmock says '...').
        payload = await super()._serve_list(request)
        payload["metadata"]["resourceVersion"] = str(_latest["version"])
        return payload

    async def _serve_watch(self, request):
        # kmock replays every object as ADDED when a watch opens; a real server
        # sends only what changed after the requested version, and kopf trusts that.
        since = request.params.get("resourceVersion", "")
        since = int(since) if since.isdigit() else 0
        async for item in super()._serve_watch(request):
            replayed = isinstance(item, dict) and item.get("type") == "ADDED"
            if replayed and int(item["object"]["metadata"].get("resourceVersion", "0")) <= since:
                continue
            yield item

    async def _handle(self, request):
        data = request.data
        if request.resource is not None and isinstance(data, dict | list):
            _latest["version"] = next(_versions)
            version = str(_latest["version"])
            if request.action == kmock.action.CREATE and isinstance(data, dict):
                meta = data.setdefault("metadata", {})
                meta.setdefault("uid", str(uuid.uuid4()))
                if "name" not in meta and "generateName" in meta:  # kopf's Events
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                meta.setdefault("namespace", request.namespace)
                meta["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                meta["resourceVersion"] = version
                meta["generation"] = 1
            elif request.action == kmock.action.UPDATE:
                stamps = {"resourceVersion": version}
                if request.subresource is None and _touches_spec(data):
                    current = self.objects[request.resource, request.namespace, request.name]
                    stamps["generation"] = current["metadata"].get("generation", 1) + 1
                if isinstance(data, dict):
                    data.setdefault("metadata", {}).update(stamps)
                else:
                    data.extend(
                        {"op": "add", "path": f"/metadata/{key}", "value": value}
                        for key, value in stamps.items()
                    )
        try:
            return await super()._handle(request)
        except jsonpatch.JsonPatchTestFailed as exc:
            # The API server answers a failed `test` op (kopf's optimistic lock on
            # resourceVersion) with 422, which kopf treats as "retry next cycle".
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from exc
