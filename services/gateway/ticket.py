"""An admitted request: what the pipeline decided for it, carried to the engine."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from maas.v1 import engine_pb2
from maas_services.common.openai_api.parsed_request import ParsedRequest
from maas_services.gateway.admission.fair_queue import FairQueue
from maas_services.gateway.admission.quota_gate import Reservation
from maas_services.gateway.admission.rate_limiter import LimitDecision
from maas_services.gateway.admission.tenants import Principal
from maas_services.gateway.routing.routing_table import Route
from maas_services.gateway.upstream.prompt_encoder import Prompt

if TYPE_CHECKING:  # engine_client.py imports this module
    from maas_services.gateway.upstream.engine_client import EarlyPick


@dataclass
class Ticket:
    """Holds a queue slot, a token reservation and, for a prepaid tenant, a hold
    on its balance until its Run (run.py) ends them; set once, at admission.

    `sampling` is what the engine receives: the request's, max_tokens resolved.
    """

    principal: Principal
    request: ParsedRequest
    route: Route
    prompt: Prompt
    sampling: engine_pb2.SamplingParams
    queue: FairQueue
    limits: LimitDecision
    # The prepaid balance's hold (quota_gate.Reservation), which the request's
    # Run settles to the real cost with the usage event, or releases.
    reservation: Reservation
    # The first attempt's pick, sent during admission (engine_client.EarlyPick);
    # None where it was not (pipeline.py). The Run cancels it if never used.
    pick: "EarlyPick | None" = None

    @property
    def headers(self) -> dict[str, str]:
        return {"x-request-id": self.request.request_id, **self.limits.headers()}
