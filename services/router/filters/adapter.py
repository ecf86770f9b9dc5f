"""A request naming a LoRA adapter goes only to replicas that serve adapters
(LoadReport.max_loras above 0): any other would refuse it. Base requests pass."""

from maas_services.router.endpoints import Endpoint
from maas_services.router.plugin import PickContext


class AdapterFilter:
    def filter(self, ctx: PickContext, endpoints: list[Endpoint]) -> list[Endpoint]:
        if not ctx.adapter:
            return endpoints
        return [e for e in endpoints if e.max_loras > 0]
