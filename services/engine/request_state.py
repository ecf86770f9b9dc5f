"""What the engine tracks for one request between its arrival and its finish."""

import time
from dataclasses import dataclass, field

from maas.v1 import common_pb2


@dataclass
class RequestState:
    request_id: str
    prompt_ids: list[int]
    arrived_at: float = field(default_factory=time.perf_counter)
    aborted: bool = False
    first_token_at: float | None = None
    completion_tokens: int = 0


FINISH_REASONS = {
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "abort": common_pb2.FINISH_REASON_ABORT,
}
