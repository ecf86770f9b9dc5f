"""gRPC stubs for the gateway's peers; one channel per engine address, reused."""

import asyncio

import grpc

from maas.v1 import engine_pb2_grpc, router_pb2_grpc, tokenizer_pb2_grpc
from services.common.grpc_client import open_channel


class Upstreams:
    def __init__(self, tokenizer_address: str, router_address: str):
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.tokenizer = tokenizer_pb2_grpc.TokenizerStub(self._channel(tokenizer_address))
        self.router = router_pb2_grpc.RouterStub(self._channel(router_address))

    def _channel(self, address: str) -> grpc.aio.Channel:
        if address not in self._channels:
            self._channels[address] = open_channel(address, "gateway")
        return self._channels[address]

    def engine(self, address: str) -> engine_pb2_grpc.EngineStub:
        return engine_pb2_grpc.EngineStub(self._channel(address))

    async def wait_connected(self, address: str, timeout: float) -> None:
        """The connect timeout: a call on a channel that cannot connect would
        otherwise wait for its whole deadline. Free when already connected."""
        channel = self._channel(address)
        if channel.get_state(try_to_connect=True) != grpc.ChannelConnectivity.READY:
            await asyncio.wait_for(channel.channel_ready(), timeout)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
