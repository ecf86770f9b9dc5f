"""Endpoints and pick contexts for plugin tests, without engines."""

from services.router.endpoints import Endpoint
from services.router.pick_history import PickHistory
from services.router.plugin import PickContext, PluginDeps
from services.router.prefix_index import PrefixIndex
from services.router.settings import RouterSettings

MODEL = "m"


def endpoint(endpoint_id: str, **fields) -> Endpoint:
    fields.setdefault("reachable", True)
    return Endpoint(endpoint_id=endpoint_id, address=f"{endpoint_id}:1", model=MODEL, **fields)


def context(tokens: list[int] | None = None, **fields) -> PickContext:
    return PickContext(request_id="r", model=MODEL, token_ids=tokens or [], now=100.0, **fields)


def deps(**settings) -> PluginDeps:
    config = RouterSettings(**settings)
    return PluginDeps(
        PrefixIndex(),
        PickHistory(config.history_ttl_seconds, config.history_max_blocks),
        config,
    )
