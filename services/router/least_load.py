"""Least-loaded picking: the fewest requests in flight, then the shortest engine queue."""

from services.router.endpoints import Endpoint


def pick_least_loaded(candidates: list[Endpoint]) -> Endpoint | None:
    if not candidates:
        return None
    # in_flight is exact for this router; the engine's own counts break ties
    # and reflect traffic from other router replicas.
    return min(
        candidates,
        key=lambda e: (e.in_flight, e.running + e.waiting, e.kv_cache_usage, e.endpoint_id),
    )
