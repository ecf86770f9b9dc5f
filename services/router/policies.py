"""The routing policies a deployment chooses from, as plugin names and weights.

prefix_affinity weighs a full prefix match (6) above everything else together
(1 + 2 + 1 + 1): a replica holding the whole prompt only loses it through the
overload guard, while a partial match trades off against load. Load is judged
mostly on requests at the replica, which is exact for this router's own picks.
Adapter affinity counts as much again: its steps (holds the adapter 12, has
room 6, neither 0) are each larger than all of load, so an adapter request
leaves the replicas holding its adapter only through the overload guard, and
one with room before one that must evict. Every policy filters an adapter
request to replicas that serve adapters.
The names are services/common/routing_policies.py's, which the CRD offers too
(tests/unit/common/test_contracts.py holds the two equal).
"""

from dataclasses import dataclass, field

from maas_services.common.routing_policies import DEFAULT_ROUTING_POLICY
from maas_services.router.registry import SCORERS


@dataclass(frozen=True)
class Policy:
    name: str
    filters: tuple[str, ...]
    picker: str
    weights: dict[str, float] = field(default_factory=dict)


POLICIES = {
    "round_robin": Policy("round_robin", ("available", "adapter"), "round_robin"),
    "least_load": Policy(
        "least_load",
        ("available", "adapter"),
        "max_score",
        {"requests": 2.0, "queue": 1.0, "kv_cache": 1.0},
    ),
    "prefix_affinity": Policy(
        "prefix_affinity",
        ("available", "adapter", "overload"),
        "max_score",
        {
            "prefix": 6.0,
            "adapter": 12.0,
            "session": 1.0,
            "requests": 2.0,
            "queue": 1.0,
            "kv_cache": 1.0,
        },
    ),
}


def resolve(name: str, weights: dict[str, float] | None = None) -> Policy:
    """A named policy with some weights overridden; weight 0 turns a scorer off.

    Accepts the CRD's spelling too (prefix-affinity). Raises ValueError naming
    what is wrong, so a bad flag fails at startup.
    """
    key = (name or DEFAULT_ROUTING_POLICY).replace("-", "_")
    if key not in POLICIES:
        raise ValueError(f"unknown routing policy {name!r}; choose from {sorted(POLICIES)}")
    base = POLICIES[key]
    unknown = set(weights or {}) - set(SCORERS)
    if unknown:
        raise ValueError(f"unknown scorer(s) {sorted(unknown)}; choose from {sorted(SCORERS)}")
    if any(w < 0 for w in (weights or {}).values()):
        raise ValueError("scorer weights must not be negative")
    merged = {**base.weights, **(weights or {})}
    return Policy(base.name, base.filters, base.picker, {k: w for k, w in merged.items() if w})
