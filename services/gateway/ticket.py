"""An admitted request: what the pipeline decided for it, carried to the engine."""

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from maas.v1 import engine_pb2
from services.gateway.fair_queue import FairQueue
from services.gateway.parsed_request import ParsedRequest
from services.gateway.prompt_encoder import Prompt
from services.gateway.quota_gate import Reservation
from services.gateway.rate_limiter import LimitDecision, Settlement
from services.gateway.routing_table import Route
from services.gateway.tenants import Principal


@dataclass
class Ticket:
    """Holds a queue slot, a token reservation and, for a prepaid tenant, a hold
    on its balance until the pipeline settles them.

    `sampling` is what the engine receives: the request's, max_tokens resolved.
    """

    principal: Principal
    request: ParsedRequest
    route: Route
    prompt: Prompt
    sampling: engine_pb2.SamplingParams
    queue: FairQueue
    limits: LimitDecision
    # Set when the request was cut short before its first token (the client
    # gone, a first-token timeout) with its prefill to bill; yields the UsageEvent.
    abandoned: asyncio.Task | None = None
    # Set by the front once the response's last byte is out (background.after).
    delivered: asyncio.Event = field(default_factory=asyncio.Event)
    # The limiter's settle for the tokens used (rate_limiter.Settlement), for
    # the engine client to send with the usage event of a stream that started.
    settlement: Callable[[int], Settlement | None] = lambda used: None
    # The prepaid balance's hold (quota_gate.Reservation): settled to the real
    # cost with the usage event, or released when there is nothing to bill.
    reservation: Reservation | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"x-request-id": self.request.request_id, **self.limits.headers()}
