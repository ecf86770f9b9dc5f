"""Server-side apply's field ownership, as the API server documents it, kept small.

https://kubernetes.io/docs/reference/using-api/server-side-apply/ — each field
of an object is owned by the managers that last set it:
- an apply (PATCH application/apply-patch+yaml) by manager M sets every field of
  M's applied configuration; a field another manager owns with a different value
  is a conflict (409) unless the apply is forced, which moves it to M; a field
  set to the same value is shared;
- a field M applied before and leaves out now is removed from the object unless
  another manager still owns it;
- any other write (create, update, merge or JSON patch) moves every field it
  changed to its manager, whatever the value was before.

Fields are leaf paths in managedFields' own notation (`f:spec`, `f:replicas`;
an item of a list keyed by name as `k:{"name":"engine"}`). Lists the API
declares as maps (containers, env, ports, volumes ...) merge item by item by
their keys, as `x-kubernetes-list-type: map` says; every other list is atomic,
owned and replaced whole. Left out, as no test of ours needs them: sets of
scalars (`list-type: set`), `granular` maps, and defaulting.
"""

import copy
import json
from dataclasses import dataclass, field

Path = tuple[str, ...]
# The fields the API server keeps for itself: never owned, never applied.
SERVER_FIELDS = {"apiVersion", "kind", "status"}
SERVER_METADATA = {
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "managedFields",
}
# The keyed lists of the kinds the operator writes (the API's x-kubernetes-list-map-keys).
LIST_KEYS = {
    "containers": ("name",),
    "initContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "imagePullSecrets": ("name",),
    "conditions": ("type",),
}


def _list_keys(name: str, items: list) -> tuple[str, ...] | None:
    if name == "ports":  # a container's ports by containerPort, a Service's by port
        first = items[0] if items and isinstance(items[0], dict) else {}
        return ("containerPort",) if "containerPort" in first else ("port",)
    return LIST_KEYS.get(name)


def _item_key(item: dict, keys: tuple[str, ...]) -> str:
    found = {k: item[k] for k in keys if k in item}
    return "k:" + json.dumps(found, separators=(",", ":"), sort_keys=True)


def leaves(obj: dict, top: bool = True) -> dict[Path, object]:
    """Every owned field of an object: its leaf path -> value."""
    found: dict[Path, object] = {}
    for name, value in obj.items():
        if top and name in SERVER_FIELDS:
            continue
        if top and name == "metadata":
            value = {k: v for k, v in value.items() if k not in SERVER_METADATA}
        here = f"f:{name}"
        keys = _list_keys(name, value) if isinstance(value, list) else None
        if isinstance(value, dict) and value:
            found.update({(here, *p): v for p, v in leaves(value, False).items()})
        elif keys and all(isinstance(i, dict) for i in value):
            for item in value:
                item_path = (here, _item_key(item, keys))
                found.update({(*item_path, *p): v for p, v in leaves(item, False).items()})
        else:
            found[(here,)] = value
    return found


def _child(container, step: str, create: bool):
    """The dict one path step leads to inside container, made when create."""
    if step.startswith("k:"):
        wanted = json.loads(step[2:])
        for item in container:
            if all(item.get(k) == v for k, v in wanted.items()):
                return item
        if not create:
            return None
        container.append(dict(wanted))
        return container[-1]
    name = step[2:]
    if name not in container and create:
        container[name] = {}
    return container.get(name)


def _container_for(step: str, following: str | None):
    return [] if following and following.startswith("k:") else {}


def put(obj: dict, path: Path, value) -> None:
    node = obj
    for i, step in enumerate(path[:-1]):
        if step.startswith("f:") and step[2:] not in node:
            node[step[2:]] = _container_for(step, path[i + 1])
        node = _child(node, step, create=True)
    name = path[-1][2:]
    if value == {} and isinstance(node.get(name), dict):
        return  # an empty map owns the map, it does not clear what others set in it
    node[name] = copy.deepcopy(value)


def _empty(node, step: str) -> bool:
    """Nothing left in it; for a list item, nothing but the keys that name it."""
    if step.startswith("k:"):
        return node.keys() <= json.loads(step[2:]).keys()
    return node in ({}, [])


def remove(obj: dict, path: Path) -> None:
    """Remove a field, then every map or list item it leaves empty."""
    chain = [obj]
    for step in path[:-1]:
        node = _child(chain[-1], step, create=False)
        if node is None:
            return
        chain.append(node)
    # An item's keys go with the item, whatever order its fields are removed in.
    item_keys = json.loads(path[-2][2:]) if len(path) > 1 and path[-2].startswith("k:") else {}
    if path[-1][2:] not in item_keys:
        chain[-1].pop(path[-1][2:], None)
    for depth in range(len(path) - 1, 0, -1):
        parent, step, node = chain[depth - 1], path[depth - 1], chain[depth]
        if not _empty(node, step):
            break
        if step.startswith("k:"):
            parent.remove(node)
        else:
            parent.pop(step[2:], None)


class ApplyConflict(Exception):
    def __init__(self, conflicts: list[tuple[str, Path]]):
        self.conflicts = conflicts
        listed = "; ".join(f'conflict with "{m}": .{".".join(_dotted(p))}' for m, p in conflicts)
        super().__init__(f"Apply failed with {len(conflicts)} conflicts: {listed}")


def _dotted(path: Path) -> list[str]:
    return [step[2:] if step.startswith("f:") else f"[{step[2:]}]" for step in path]


@dataclass
class Managed:
    """One object's managedFields: manager -> (operation, fields)."""

    apply: dict[str, set[Path]] = field(default_factory=dict)
    update: dict[str, set[Path]] = field(default_factory=dict)

    def owners(self, path: Path, but: str = "") -> list[str]:
        return [
            manager
            for sets in (self.apply, self.update)
            for manager, fields in sets.items()
            if manager != but and path in fields
        ]

    def fields_v1(self) -> list[dict]:
        """As metadata.managedFields shows them (less apiVersion and time)."""
        entries = []
        for operation, sets in (("Apply", self.apply), ("Update", self.update)):
            for manager, fields in sorted(sets.items()):
                tree: dict = {}
                for path in fields:
                    node = tree
                    for step in path:
                        node = node.setdefault(step, {})
                entries.append(
                    {
                        "manager": manager,
                        "operation": operation,
                        "fieldsType": "FieldsV1",
                        "fieldsV1": tree,
                    }
                )
        return entries

    def applied(self, live: dict | None, config: dict, manager: str, force: bool) -> dict:
        """The object after manager applies config; raises ApplyConflict."""
        live = copy.deepcopy(live or {})
        current, wanted = leaves(live), leaves(config)
        conflicts = [
            (other, path)
            for path, value in wanted.items()
            if path in current and current[path] != value
            for other in self.owners(path, but=manager)
        ]
        if conflicts and not force:
            raise ApplyConflict(sorted(conflicts))
        for other, path in conflicts:  # forced: the fields move to this manager
            for sets in (self.apply, self.update):
                sets.get(other, set()).discard(path)
        for path in sorted(self.apply.get(manager, set()) - wanted.keys()):
            if not self.owners(path, but=manager):
                remove(live, path)
        for path, value in wanted.items():
            put(live, path, value)
        self.apply[manager] = set(wanted)
        self._drop_empty()
        return live

    def updated(self, before: dict | None, after: dict, manager: str) -> None:
        """Any other write: the fields it changed are its manager's alone."""
        old, new = leaves(before or {}), leaves(after)
        changed = {p for p, v in new.items() if p not in old or old[p] != v}
        gone = old.keys() - new.keys()
        for sets in (self.apply, self.update):
            for other, fields in sets.items():
                fields -= gone
                if other != manager:
                    fields -= changed
        self.update.setdefault(manager, set()).update(changed)
        self._drop_empty()

    def _drop_empty(self) -> None:
        for sets in (self.apply, self.update):
            for manager in [m for m, fields in sets.items() if not fields]:
                del sets[manager]
