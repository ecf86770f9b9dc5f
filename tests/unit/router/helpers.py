"""Endpoints and pick contexts for plugin tests, without engines."""

from maas_services.common.block_hash import prefix_block_hashes, request_salt
from maas_services.router.endpoints import Endpoint
from maas_services.router.pick_history import PickHistory
from maas_services.router.plugin import PickContext, PluginDeps
from maas_services.router.prefix_index import PrefixIndex
from maas_services.router.settings import RouterSettings

MODEL = "m"
TENANT = "t"


def endpoint(endpoint_id: str, **fields) -> Endpoint:
    fields.setdefault("reachable", True)
    return Endpoint(endpoint_id=endpoint_id, address=f"{endpoint_id}:1", model=MODEL, **fields)


def context(tokens: list[int] | None = None, **fields) -> PickContext:
    fields.setdefault("tenant", TENANT)
    return PickContext(request_id="r", model=MODEL, token_ids=tokens or [], now=100.0, **fields)


def blocks(tokens: list[int], block_size: int = 16, engine_salt: str = MODEL) -> list[int]:
    """The block hashes an engine caches for TENANT's request of `tokens`."""
    return prefix_block_hashes(
        tokens, block_size, request_salt(engine_salt, "tenant", TENANT, False)
    )


def deps(**settings) -> PluginDeps:
    config = RouterSettings(**settings)
    return PluginDeps(
        PrefixIndex(),
        PickHistory(config.history_ttl_seconds, config.history_max_blocks),
        config,
    )
