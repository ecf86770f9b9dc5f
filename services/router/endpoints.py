"""Engine endpoints the router knows about and the load each last reported.

Discovery is a static list here (local mode); the load fields are refreshed by
polling each engine's GetLoad. ``in_flight`` is this router's own count of
picks not yet released, exact between polls.
"""

from dataclasses import dataclass


@dataclass
class Endpoint:
    endpoint_id: str
    address: str
    model: str = ""
    ready: bool = False
    draining: bool = False
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    max_num_seqs: int = 0
    in_flight: int = 0

    @property
    def available(self) -> bool:
        return self.ready and not self.draining


def parse_static(entries: list[str]) -> list[Endpoint]:
    """Accept `id=host:port` or bare `host:port` (then the address is the id)."""
    endpoints, seen = [], set()
    for entry in entries:
        endpoint_id, sep, address = entry.partition("=")
        if not sep:
            endpoint_id, address = entry, entry
        if not address or ":" not in address:
            raise ValueError(f"engine endpoint {entry!r} is not ID=HOST:PORT or HOST:PORT")
        if endpoint_id in seen:
            raise ValueError(f"engine endpoint id {endpoint_id!r} appears twice")
        seen.add(endpoint_id)
        endpoints.append(Endpoint(endpoint_id=endpoint_id, address=address))
    return endpoints
