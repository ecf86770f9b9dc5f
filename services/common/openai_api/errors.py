"""OpenAI-shaped errors: every failure a client sees is one of these.

Body: {"error": {"message", "type", "param", "code"}} with the HTTP status
OpenAI uses for the same condition.
"""

from dataclasses import dataclass

import grpc

# The status both fronts log for a client that closed the connection before
# the answer (nginx's; no response reaches that client).
CLIENT_CLOSED = 499


@dataclass
class APIError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] | None = None

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def model_not_found(model: str) -> APIError:
    return APIError(
        404,
        f"The model '{model}' does not exist or you do not have access to it.",
        code="model_not_found",
        param="model",
    )


def unauthorized(message: str) -> APIError:
    return APIError(401, message, code="invalid_api_key")


def unavailable(message: str, retry_after: int = 1) -> APIError:
    return APIError(
        503,
        message,
        type="service_unavailable",
        code="service_unavailable",
        headers={"Retry-After": str(retry_after)},
    )


# Why the gateway dropped a request to protect other tenants (as llm-d's
# x-llm-d-request-dropped-reason); over gRPC, trailing metadata.
DROPPED_REASON_HEADER = "x-maas-request-dropped-reason"


def dropped(message: str, reason: str, retry_after: int = 1) -> APIError:
    """429 for a request dropped as its tenant's own excess (reason: e.g. queue-fair-share)."""
    return APIError(
        429,
        message,
        type="requests",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(retry_after), DROPPED_REASON_HEADER: reason},
    )


def from_upstream(exc: grpc.aio.AioRpcError, model: str, param: str | None = None) -> APIError:
    """Translate a peer service's gRPC status into what the client should see."""
    code, detail = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return bad_request(detail, param=param)
    if code == grpc.StatusCode.NOT_FOUND:
        return model_not_found(model)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
        return unavailable(f"no capacity for model '{model}' right now: {detail}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return APIError(504, "the model did not answer in time", type="timeout", code="timeout")
    return APIError(502, f"upstream error: {code.name}", type="api_error", code="upstream_error")
