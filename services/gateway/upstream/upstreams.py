"""gRPC stubs for the gateway's peers; one channel per address, reused.

Every failure of a peer is counted here, in maas_gateway_upstream_errors_total
{upstream, endpoint, kind}, and nowhere else: each stub's calls report their
final status code, and the two waits the gateway times itself (connect, first
token) report their timeouts. `endpoint` is the configured address of the
tokenizer and the router, and the router's endpoint id of an engine replica
(the label its breaker and the router's replica metrics use), so there is one
value per replica.

Counted kinds: connect_timeout, first_token_timeout, no_output (an engine
stream that ended before its first message), and the lower-case names of the
gRPC codes that mean the peer failed (FAULTS). Not counted: OK, CANCELLED (the
gateway cancelled: a client left, or a timeout counted above), codes that are
the request's own fault (INVALID_ARGUMENT, NOT_FOUND...), and the router's
UNAVAILABLE answer to Pick, which means no replica is left, not that the
router failed (maas_router_picks_total{outcome="no_endpoint"} counts those).
"""

import asyncio
import time
from collections.abc import Callable

import grpc
from prometheus_client import Counter

from maas.v1 import engine_pb2_grpc, router_pb2_grpc, tokenizer_pb2_grpc
from maas_services.common.grpc_client import client_calls, open_plain_channel
from maas_services.common.grpc_interceptors import SERVER_ERRORS, ClientCalls
from maas_services.common.single_flight import SingleFlight
from maas_services.gateway.upstream.engine_mux import EngineMux

ERRORS = Counter(
    "maas_gateway_upstream_errors",
    "Failed calls to the tokenizer, router and engines, by endpoint and kind",
    ["upstream", "endpoint", "kind"],
)
TOKENIZER, ROUTER, ENGINE = "tokenizer", "router", "engine"
# The peer failed or is overloaded; the other codes are the request's doing.
FAULTS = SERVER_ERRORS | {grpc.StatusCode.RESOURCE_EXHAUSTED}
# (upstream, method) -> codes that are an answer, not a failure.
ANSWERS = {(ROUTER, "Pick"): {grpc.StatusCode.UNAVAILABLE}}
# A stream's status is read in a task of its own; held here until it has run.
_RECORDING: set[asyncio.Task] = set()


def count_error(upstream: str, endpoint: str, kind: str) -> None:
    ERRORS.labels(upstream, endpoint, kind).inc()


class CountedStub:
    """A generated stub whose calls carry the service token and trace context,
    get their CLIENT span and client metrics (ClientCalls), and count their
    failures once they end.

    The channels have no grpc.aio interceptors: an intercepted call runs in a
    task of its own beside the call's, and its status was read in two more
    (the interceptor's metrics, this count), several times the call's own
    cost. A unary call is observed where it is awaited; a stream, when it ends.
    """

    def __init__(self, stub, service: str, upstream: str, endpoint: str, calls: ClientCalls):
        self._stub, self._service = stub, service
        self._upstream, self._endpoint, self._calls = upstream, endpoint, calls

    def __getattr__(self, method: str):
        multicallable = getattr(self._stub, method)
        full = f"/{self._service}/{method}"
        answers = ANSWERS.get((self._upstream, method), frozenset())
        if isinstance(multicallable, grpc.aio.UnaryStreamMultiCallable):
            invoke = self._streaming(multicallable, full, answers)
        else:
            invoke = self._unary(multicallable, full, answers)
        setattr(self, method, invoke)  # once per method, not per call
        return invoke

    def _unary(self, multicallable, full: str, answers):
        calls = self._calls

        async def invoke(request, timeout=None, metadata=None):
            metadata, span = calls.start(full, metadata)
            started, code = time.perf_counter(), grpc.StatusCode.OK
            try:
                return await multicallable(request, timeout=timeout, metadata=metadata)
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                raise
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            except BaseException:
                code = grpc.StatusCode.UNKNOWN
                raise
            finally:
                calls.finish(full, started, code, span)
                self._count(code, answers)

        return invoke

    def _streaming(self, multicallable, full: str, answers):
        def invoke(request, timeout=None, metadata=None):
            return self._observed(
                full,
                answers,
                lambda with_trace: multicallable(request, timeout=timeout, metadata=with_trace),
                metadata,
            )

        return invoke

    def observed_stream(self, method: str, start: Callable[[list], object]):
        """A streaming call made by `start(metadata)` (an engine's call over its
        GenerateMany stream), observed as this stub's own calls of `method` are."""
        return self._observed(f"/{self._service}/{method}", frozenset(), start, None)

    def _observed(self, full: str, answers, start, metadata):
        metadata, span = self._calls.start(full, metadata)
        started = time.perf_counter()
        call = start(metadata)
        call.add_done_callback(lambda done: self._on_done(done, full, started, span, answers))
        return call

    def _on_done(self, call, full: str, started: float, span, answers) -> None:
        async def record() -> None:
            code = await call.code()
            self._calls.finish(full, started, code, span)
            self._count(code, answers)

        task = asyncio.ensure_future(record())
        _RECORDING.add(task)
        task.add_done_callback(_RECORDING.discard)

    def _count(self, code: grpc.StatusCode, answers) -> None:
        if code in FAULTS and code not in answers:
            count_error(self._upstream, self._endpoint, code.name.lower())


class Upstreams:
    def __init__(self, tokenizer_address: str, router_address: str):
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._engines: dict[tuple[str, str], CountedStub] = {}
        # address -> its GenerateMany stream (engine_mux.py); None: the engine has none.
        self._muxes: dict[str, EngineMux | None] = {}
        # One opening at a time per address; the requests meanwhile wait for it.
        self._opening: SingleFlight[EngineMux | None] = SingleFlight()
        self._calls = client_calls("gateway")
        self.tokenizer = CountedStub(
            tokenizer_pb2_grpc.TokenizerStub(self._channel(tokenizer_address)),
            "maas.v1.Tokenizer",
            TOKENIZER,
            tokenizer_address,
            self._calls,
        )
        self.router = CountedStub(
            router_pb2_grpc.RouterStub(self._channel(router_address)),
            "maas.v1.Router",
            ROUTER,
            router_address,
            self._calls,
        )

    def _channel(self, address: str) -> grpc.aio.Channel:
        if address not in self._channels:
            self._channels[address] = open_plain_channel(address)
        return self._channels[address]

    def engine(self, address: str, endpoint_id: str) -> CountedStub:
        """An EngineStub for the replica at `address`, counting under its endpoint id."""
        key = (address, endpoint_id)
        if key not in self._engines:
            self._engines[key] = CountedStub(
                engine_pb2_grpc.EngineStub(self._channel(address)),
                "maas.v1.Engine",
                ENGINE,
                endpoint_id,
                self._calls,
            )
        return self._engines[key]

    async def generate(
        self, address: str, endpoint_id: str, request, timeout: float, connect: float
    ) -> "grpc.aio.UnaryStreamCall":
        """A Generate call to the engine at `address`: over its GenerateMany
        stream (engine_mux.py), or its own call where the engine has none.
        `connect`: how long opening that stream may take (TimeoutError)."""
        stub = self.engine(address, endpoint_id)
        mux = await self._mux(address, connect)
        if mux is None:
            return stub.Generate(request, timeout=timeout)
        return stub.observed_stream(
            "Generate", lambda metadata: mux.start(request, timeout, metadata)
        )

    async def _mux(self, address: str, connect: float) -> EngineMux | None:
        mux = self._muxes.get(address)
        if address in self._muxes and (mux is None or not mux.closed):
            return mux
        return await self._opening.run(address, lambda: self._open(address, connect))

    async def _open(self, address: str, connect: float) -> EngineMux | None:
        mux = EngineMux(self._channel(address), self._calls.credentials)
        try:
            async with asyncio.timeout(connect):
                speaks = await mux.open()
        except BaseException:
            mux.close()
            raise
        self._muxes[address] = mux if speaks else None
        return self._muxes[address]

    async def wait_connected(self, address: str, endpoint_id: str, timeout: float) -> None:
        """An engine's connect timeout: a call on a channel that cannot connect
        would otherwise wait for its whole deadline. Free when already connected."""
        channel = self._channel(address)
        if channel.get_state(try_to_connect=True) != grpc.ChannelConnectivity.READY:
            try:
                await asyncio.wait_for(channel.channel_ready(), timeout)
            except TimeoutError:
                count_error(ENGINE, endpoint_id, "connect_timeout")
                raise

    @staticmethod
    async def first_message(reading: asyncio.Future, endpoint_id: str, timeout: float):
        """An engine stream's first message (or EOF), waited for at most `timeout`.

        `reading` is the call's read() in a task, and shielded: a caller
        cancelled while it waits leaves the read, and so the call, running."""
        try:
            first = await asyncio.wait_for(asyncio.shield(reading), timeout)
        except TimeoutError:
            count_error(ENGINE, endpoint_id, "first_token_timeout")
            raise
        if first is grpc.aio.EOF:
            count_error(ENGINE, endpoint_id, "no_output")
        return first

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
