"""Why a choice ended: the OpenAI string and maas.v1.FinishReason, one table both ways.

The engine answers with the proto enum, the gateway's HTTP front writes the
OpenAI string and its gRPC front the enum again; one table means a new reason
is added once and every hop names it the same. "error" (a broken engine
stream, set by the gateway) has no proto value: it is never sent.
"""

from maas.v1 import common_pb2

FINISH_CODES: dict[str, int] = {
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "abort": common_pb2.FINISH_REASON_ABORT,
    "content_filter": common_pb2.FINISH_REASON_CONTENT_FILTER,
    "tool_calls": common_pb2.FINISH_REASON_TOOL_CALLS,
}
FINISH_NAMES: dict[int, str] = {code: name for name, code in FINISH_CODES.items()}
