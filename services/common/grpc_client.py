"""Channels to peer services, with the shared interceptors and limits."""

import grpc

from maas_services.common.grpc_interceptors import ClientCalls, client_interceptors
from maas_services.common.grpc_server import CHANNEL_OPTIONS
from maas_services.common.service_token import service_token

OPTIONS = [*CHANNEL_OPTIONS, ("grpc.enable_retries", 1)]


def open_channel(address: str, caller: str, token: str | None = None) -> grpc.aio.Channel:
    """An insecure aio channel whose calls carry the service token (`token`, or
    this process's own when None); the caller's name labels its client metrics."""
    return grpc.aio.insecure_channel(
        address,
        options=OPTIONS,
        interceptors=client_interceptors(caller, service_token() if token is None else token),
    )


def open_plain_channel(address: str) -> grpc.aio.Channel:
    """A channel without interceptors, for a caller that wraps its calls with
    ClientCalls itself (the same token, spans and metrics)."""
    return grpc.aio.insecure_channel(address, options=OPTIONS)


def client_calls(caller: str, token: str | None = None) -> ClientCalls:
    """Token, spans and client metrics of `caller`'s calls on plain channels."""
    return ClientCalls(caller, service_token() if token is None else token)
