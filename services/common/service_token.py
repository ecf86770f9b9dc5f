"""Service-to-service authentication: one shared token per release.

Every internal gRPC server (tokenizer, router, engine, billing) refuses a call
that does not carry the release's token in the ``maas-service-token`` metadata
with UNAUTHENTICATED, before the request is parsed; every internal client
(maas_services.common.grpc_client) sends it. The health and reflection services stay
open so kubelet probes and grpcurl need no secret. The gateway's tenant gRPC
front is not internal: tenants authenticate there with API keys.

A shared token rather than mTLS: it is one Secret to create and rotate, works
the same on a laptop and a cluster, and needs no certificate authority or
cert-manager; the cost is that it proves "a service of this release", not which
one, and crosses the wire in clear text (NetworkPolicies and the cluster
network are what keep it from other tenants' eyes).

The token comes from the environment (MAAS_SERVICE_TOKEN), never a flag: a
flag is readable by every user of the host in /proc/<pid>/cmdline. Unset, the
servers accept every caller (a test's in-process server); `maas up` and the
chart always set it.
"""

import hmac
import os

import grpc

from maas_services.common.logging import get_logger

log = get_logger(__name__)

ENV = "MAAS_SERVICE_TOKEN"
METADATA_KEY = "maas-service-token"
OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def service_token() -> str:
    """This process's token; empty when the release runs without one."""
    return os.environ.get(ENV, "")


def _carries(metadata, token: bytes) -> bool:
    for key, value in metadata or ():
        if key == METADATA_KEY:
            sent = value.encode() if isinstance(value, str) else value
            return hmac.compare_digest(sent, token)
    return False


async def _refuse(_request, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"missing or wrong {METADATA_KEY}")


async def _refuse_stream(request, context: grpc.aio.ServicerContext):
    # A generator, as the metrics interceptor iterates streaming handlers; abort raises first.
    await _refuse(request, context)
    yield


class ServiceTokenInterceptor(grpc.aio.ServerInterceptor):
    """Admits calls that carry `token`, and every call to health and reflection."""

    def __init__(self, token: str):
        self._token = token.encode()

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(OPEN_SERVICES):
            return handler
        if _carries(handler_call_details.invocation_metadata, self._token):
            return handler
        # No deserializer: a refused caller's message is never parsed.
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(_refuse_stream)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(_refuse)
        if handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(_refuse_stream)
        return grpc.unary_unary_rpc_method_handler(_refuse)


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    """The token check for an internal server, or none when no token is set."""
    token = service_token()
    if not token:
        log.warning("service_token_unset", detail=f"{ENV} is empty: any caller is accepted")
        return []
    return [ServiceTokenInterceptor(token)]
