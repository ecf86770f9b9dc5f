"""Channels to peer services, with the shared interceptors and limits."""

import grpc

from services.common.grpc_interceptors import client_interceptors
from services.common.grpc_server import CHANNEL_OPTIONS
from services.common.service_token import service_token


def open_channel(address: str, caller: str, token: str | None = None) -> grpc.aio.Channel:
    """An insecure aio channel whose calls carry the service token (`token`, or
    this process's own when None); the caller's name labels its client metrics."""
    return grpc.aio.insecure_channel(
        address,
        options=[*CHANNEL_OPTIONS, ("grpc.enable_retries", 1)],
        interceptors=client_interceptors(caller, service_token() if token is None else token),
    )
