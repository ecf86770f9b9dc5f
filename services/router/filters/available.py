"""Only replicas that may take new work: reachable, ready, not draining or
terminating, and not one that already failed this request (a gateway retry)."""

from maas_services.router.endpoints import Endpoint
from maas_services.router.plugin import PickContext


class AvailableFilter:
    def filter(self, ctx: PickContext, endpoints: list[Endpoint]) -> list[Endpoint]:
        return [e for e in endpoints if e.available and e.endpoint_id not in ctx.exclude]
