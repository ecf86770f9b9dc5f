"""Channels to peer services, with the shared interceptors and limits."""

import grpc

from services.common.grpc_interceptors import client_interceptors
from services.common.grpc_server import CHANNEL_OPTIONS


def open_channel(address: str, caller: str) -> grpc.aio.Channel:
    """An insecure aio channel; the caller's name labels its client metrics."""
    return grpc.aio.insecure_channel(
        address,
        options=[*CHANNEL_OPTIONS, ("grpc.enable_retries", 1)],
        interceptors=client_interceptors(caller),
    )
