"""The gateway's Generate calls over one GenerateMany stream per engine (issue 38).

Real gRPC on loopback: a stub engine (its Generate, served per call by
common/generate_mux.py) on an event loop of its own, the gateway's Upstreams
calling it. Each call must read exactly as its own Generate call would; the
calls of a step share messages; one slow reader holds back only its own call.
"""

import asyncio
import threading

import grpc
import pytest

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_services.common.engine_metadata import was_scheduled
from maas_services.common.generate_mux import GENERATE_WINDOW, MAX_EVENTS
from maas_services.gateway.upstream.upstreams import Upstreams
from tests.integration.gateway.stubs import StubEngine, start


class CountingEngine(StubEngine):
    """Counts its GenerateMany streams and messages, and what each call's Generate yielded."""

    def __init__(self, tokens: int):
        super().__init__("m", [f" t{i}" for i in range(tokens)])
        self.streams = 0
        self.messages = 0
        self.largest = 0  # events in the stream's largest message
        self.yielded: dict[str, int] = {}

    async def GenerateMany(self, request_iterator, context):
        self.streams += 1
        async for events in super().GenerateMany(request_iterator, context):
            self.messages += 1
            self.largest = max(self.largest, len(events.events))
            yield events

    async def Generate(self, request, context):
        self.yielded[request.request_id] = 0
        async for response in super().Generate(request, context):
            self.yielded[request.request_id] += 1
            yield response


class PlainEngine(CountingEngine):
    """An engine from before GenerateMany: it answers UNIMPLEMENTED."""

    GenerateMany = engine_pb2_grpc.EngineServicer.GenerateMany


@pytest.fixture
async def serve():
    """serve(servicer, port) -> (Upstreams, address, on_loop): the servicer on a loop
    of its own; on_loop(coroutine) runs there. Serving again on a port stops what
    served there."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servers, upstreams = {}, Upstreams("127.0.0.1:1", "127.0.0.1:1")

    def on_loop(coroutine, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout)

    def serve(servicer, port: int = 0):
        if port in servers:
            on_loop(servers.pop(port).stop(0))
        server, address = on_loop(
            start(servicer, engine_pb2_grpc.add_EngineServicer_to_server, port)
        )
        servers[int(address.rsplit(":", 1)[1])] = server
        return upstreams, address, on_loop

    yield serve
    await upstreams.close()
    for server in servers.values():
        on_loop(server.stop(0))
    loop.call_soon_threadsafe(loop.stop)
    thread.join(30)


def request(request_id: str, max_tokens: int = 0) -> engine_pb2.GenerateRequest:
    return engine_pb2.GenerateRequest(
        request_id=request_id,
        model="m",
        prompt_token_ids=[1, 2, 3],
        sampling=engine_pb2.SamplingParams(max_tokens=max_tokens),
    )


async def read_all(call) -> list[engine_pb2.GenerateResponse]:
    messages = []
    while (message := await call.read()) is not grpc.aio.EOF:
        messages.append(message)
    return messages


async def generate(upstreams: Upstreams, address: str, request_id: str, timeout: float = 30):
    return await upstreams.generate(address, "e0", request(request_id), timeout, 5)


async def test_calls_share_one_stream_and_read_as_their_own_calls(serve):
    engine = CountingEngine(tokens=12)
    upstreams, address, _ = serve(engine)
    calls = [await generate(upstreams, address, f"r{i}") for i in range(8)]
    answers = await asyncio.gather(*(read_all(call) for call in calls))
    own = engine_pb2_grpc.EngineStub(grpc.aio.insecure_channel(address)).Generate(request("own"))
    expected = await read_all(own)
    for answer in answers:
        assert [m.text for m in answer] == [m.text for m in expected]
        assert answer[-1].finish_reason == expected[-1].finish_reason
        assert answer[-1].usage == expected[-1].usage
    assert [await call.code() for call in calls] == [grpc.StatusCode.OK] * 8
    assert engine.streams == 1


async def test_tokens_made_in_one_step_share_a_message(serve):
    """Sixteen requests paced by one clock (a real engine's steps): about one
    message per step for all of them, not one per token."""
    engine = CountingEngine(tokens=20)
    engine.delay, engine.stepped = 0.01, True
    upstreams, address, _ = serve(engine)
    calls = [await generate(upstreams, address, f"r{i}") for i in range(16)]
    answers = await asyncio.gather(*(read_all(call) for call in calls))
    assert all(len(answer) == 20 for answer in answers)
    # 16 x 20 tokens and 16 statuses; a message a step (20) and a few more for
    # the calls' starts and ends.
    assert engine.messages <= 2 * 20


async def test_a_step_of_many_calls_is_split_into_bounded_messages(serve):
    engine = CountingEngine(tokens=3)
    engine.delay, engine.stepped = 0.05, True
    upstreams, address, _ = serve(engine)
    calls = [await generate(upstreams, address, f"r{i}") for i in range(2 * MAX_EVENTS)]
    answers = await asyncio.gather(*(read_all(call) for call in calls))
    assert all(len(answer) == 3 for answer in answers)
    assert engine.largest == MAX_EVENTS


async def test_a_slow_reader_holds_back_only_its_own_call(serve):
    tokens = 4 * GENERATE_WINDOW
    engine = CountingEngine(tokens=tokens)
    upstreams, address, _ = serve(engine)
    slow = await generate(upstreams, address, "slow")
    fast = await generate(upstreams, address, "fast")
    # The fast call reads everything while the slow one reads nothing.
    assert len(await read_all(fast)) == tokens
    assert engine.yielded["slow"] <= GENERATE_WINDOW + 1
    # Reading it lets the engine go on: every token, in order.
    texts = [m.text for m in await read_all(slow)]
    assert texts == [f" t{i}" for i in range(tokens)]


async def test_an_engine_without_the_stream_gets_its_own_calls(serve):
    engine = PlainEngine(tokens=5)
    upstreams, address, _ = serve(engine)
    calls = [await generate(upstreams, address, f"r{i}") for i in range(3)]
    answers = await asyncio.gather(*(read_all(call) for call in calls))
    assert [len(answer) for answer in answers] == [5, 5, 5]
    assert engine.streams == 0 and engine.served == 3


async def test_an_abort_ends_the_call_with_its_code_and_metadata(serve):
    engine = CountingEngine(tokens=5)
    engine.fail, engine.scheduled = grpc.StatusCode.RESOURCE_EXHAUSTED, True
    upstreams, address, _ = serve(engine)
    call = await generate(upstreams, address, "refused")
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call.read()
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert raised.value.details() == "stub engine told to fail"
    assert was_scheduled(raised.value.initial_metadata())
    assert was_scheduled(await call.initial_metadata())
    assert await call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_a_deadline_and_a_cancel_stop_the_engine_call(serve):
    engine = CountingEngine(tokens=5)
    engine.hang = True
    upstreams, address, on_loop = serve(engine)
    late = await upstreams.generate(address, "e0", request("late"), 0.3, 5)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await late.read()
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    gone = await generate(upstreams, address, "gone")
    reading = asyncio.ensure_future(gone.read())
    await asyncio.sleep(0.2)
    assert gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    for _ in range(100):
        if {"late", "gone"} <= engine.cancelled_at.keys():
            break
        await asyncio.sleep(0.05)
    # Both handlers were cancelled on the engine, as their own calls' would be.
    assert {"late", "gone"} <= engine.cancelled_at.keys()
    assert not engine.active


async def test_a_lost_stream_ends_its_calls_and_the_next_call_opens_another(serve):
    engine = CountingEngine(tokens=1000)
    engine.delay = 0.01
    upstreams, address, _ = serve(engine)
    calls = [await generate(upstreams, address, f"r{i}") for i in range(3)]
    await asyncio.gather(*(call.read() for call in calls))
    # The engine's server gone (and started again on its port, for the next call).
    serve(engine, int(address.rsplit(":", 1)[1]))
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await read_all(call)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    engine.delay = 0.0
    again = await generate(upstreams, address, "again")
    assert len(await read_all(again)) == 1000
    assert engine.streams == 2


async def test_a_callers_odd_actions_cost_only_its_own_calls(serve):
    """Actions for calls that do not exist, a start repeated, a credit of 2^32 - 1
    and a thousand calls never read on one stream: ignored or held at their
    windows, while a call on another stream streams all its tokens."""
    engine = CountingEngine(tokens=4 * GENERATE_WINDOW)
    upstreams, address, _ = serve(engine)
    stub = engine_pb2_grpc.EngineStub(grpc.aio.insecure_channel(address))
    start = engine_pb2.GenerateStart(request=request("odd"))
    actions = [
        engine_pb2.GenerateCall(call_id=7, credit=2**32 - 1),
        engine_pb2.GenerateCall(call_id=8, cancel=True),
        engine_pb2.GenerateCall(call_id=1, start=start),
        engine_pb2.GenerateCall(call_id=1, start=start),
        *(
            engine_pb2.GenerateCall(
                call_id=100 + i, start=engine_pb2.GenerateStart(request=request(f"idle{i}"))
            )
            for i in range(1000)
        ),
    ]

    async def odd():
        for action in actions:
            yield action
        await asyncio.Event().wait()  # the stream stays open, nothing read

    hostile = stub.GenerateMany(odd())
    await hostile.initial_metadata()
    fair = await generate(upstreams, address, "fair")
    assert len(await read_all(fair)) == 4 * GENERATE_WINDOW
    for _ in range(100):
        if len(engine.yielded) >= 1002:
            break
        await asyncio.sleep(0.05)
    # One "odd" call (the repeated start ignored), each idle call at its window.
    assert engine.served == 1 + 1000 + 1
    assert max(engine.yielded[f"idle{i}"] for i in range(1000)) <= GENERATE_WINDOW + 1
    hostile.cancel()
