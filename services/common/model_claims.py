"""Which ModelDeployment a model id belongs to, for the operator and the router alike.

A ModelDeployment claims its model id (`spec.model.name`, else its own name)
and that id's canary deployment (`<id>-canary`, maas_services.common.canary), even
without a canary: the canary's pool is named so, and a second deployment must
not sneak into it. When two ModelDeployments claim one id, the first one made
keeps it (creationTimestamp, then name, then namespace: a total order every
reader computes alike) and every later one is in conflict: the operator writes
that on the later one's status (ModelIdConflict), the router pools none of its
engines. Both read the same objects, so they reach the same verdict without
talking to each other.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field

from maas_services.common.canary import canary_deployment


def model_id(name: str, spec: dict) -> str:
    """The id clients and the router use; the resource name unless spec says otherwise."""
    return (spec.get("model") or {}).get("name") or name


def claimed_ids(name: str, spec: dict) -> tuple[str, str]:
    main = model_id(name, spec)
    return main, canary_deployment(main)


@dataclass(frozen=True, order=True)
class Claimant:
    """One ModelDeployment as the claim order sees it; compares by (created, name, namespace)."""

    # RFC 3339 in UTC to the second, as the API server writes it: sorts as text.
    created: str
    name: str
    namespace: str
    uid: str = field(compare=False)
    ids: tuple[str, ...] = field(compare=False, default=())

    @classmethod
    def of(cls, obj: dict) -> "Claimant":
        meta = obj["metadata"]
        return cls(
            created=meta.get("creationTimestamp") or "",
            name=meta["name"],
            namespace=meta.get("namespace", ""),
            uid=meta.get("uid", ""),
            ids=claimed_ids(meta["name"], obj.get("spec") or {}),
        )

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Conflict:
    model: str
    holder: Claimant  # the earlier ModelDeployment that keeps the id


def conflicts(claimants: Iterable[Claimant]) -> dict[str, Conflict]:
    """By uid, each claimant that an earlier one beat to one of its ids."""
    first: dict[str, Claimant] = {}
    found: dict[str, Conflict] = {}
    for claimant in sorted(claimants):
        for model in claimant.ids:
            holder = first.setdefault(model, claimant)
            if holder is not claimant and claimant.uid not in found:
                found[claimant.uid] = Conflict(model, holder)
    return found
