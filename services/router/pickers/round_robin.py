"""Each candidate in turn, ignoring scores: the baseline the other policies must beat.

The turn counter belongs to one deployment's profile; candidates are taken in
id order so a replica leaving shifts the rotation but never skips anyone twice.
"""

from maas_services.router.endpoints import Endpoint
from maas_services.router.plugin import PickContext


class RoundRobinPicker:
    def __init__(self) -> None:
        self._turn = 0

    def pick(self, ctx: PickContext, ranked: list[tuple[Endpoint, float]]) -> Endpoint:
        ordered = sorted((e for e, _ in ranked), key=lambda e: e.endpoint_id)
        chosen = ordered[self._turn % len(ordered)]
        self._turn += 1
        return chosen
