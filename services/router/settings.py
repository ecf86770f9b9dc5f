from typing import Literal

from pydantic import Field

from maas_services.common.block_hash import BLOCK_SIZE
from maas_services.common.routing_policies import DEFAULT_ROUTING_POLICY
from maas_services.common.settings import ServiceSettings


class RouterSettings(ServiceSettings):
    discovery: Literal["static", "kubernetes"] = Field(
        "static", description="where engine endpoints come from"
    )
    engines: list[str] = Field(
        default_factory=list,
        description="static discovery: engine endpoints as ID=HOST:PORT or HOST:PORT",
    )
    kubernetes_namespaces: list[str] = Field(
        default_factory=list,
        description="kubernetes discovery: namespaces to watch, as the operator's "
        "--namespaces (the chart gives both one list); empty = every namespace",
    )
    kubeconfig: str = Field(
        "", description="kubernetes discovery outside a cluster: kubeconfig path (empty = default)"
    )
    kubernetes_selector: str = Field(
        "app.kubernetes.io/name=maas-engine",
        description="kubernetes discovery: label selector of the engine Services",
    )
    routing_policy: str = Field(
        DEFAULT_ROUTING_POLICY,
        description="round_robin, least_load or prefix_affinity; a deployment may override it",
    )
    routing_weights: dict[str, float] = Field(
        default_factory=dict,
        description='scorer weights over the policy\'s defaults, JSON: {"prefix": 6, "queue": 1}',
    )
    overload_margin: int = Field(
        8,
        ge=0,
        description="prefix_affinity: a replica with this many more requests than the "
        "least-loaded one is skipped, so load wins over cache affinity",
    )
    block_size: int = Field(
        BLOCK_SIZE,
        gt=0,
        description="prefix hashing block size when an engine doesn't report its own",
    )
    history_ttl_seconds: float = Field(
        60.0,
        gt=0,
        description="how long a routed prompt counts as cached on its replica before the "
        "engine's KV events confirm it (or, without events, at all)",
    )
    history_max_blocks: int = Field(
        200_000, gt=0, description="routing-history entries kept per replica at most"
    )
    poll_interval_seconds: float = Field(0.5, gt=0, description="how often engines report load")
