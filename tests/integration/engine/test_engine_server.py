"""`maas serve engine` as a process, over real gRPC."""

import asyncio
import signal

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from maas.v1 import common_pb2, engine_pb2, engine_pb2_grpc, router_pb2, router_pb2_grpc
from maas_services.common.block_hash import prefix_block_hashes, request_salt
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready

pytestmark = pytest.mark.slow


def request(request_id: str, max_tokens: int, **sampling) -> engine_pb2.GenerateRequest:
    return engine_pb2.GenerateRequest(
        request_id=request_id,
        prompt_token_ids=[1, 9690, 198, 19556, 451, 253, 1345, 30],
        sampling=engine_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling),
    )


async def read_all(call) -> list[engine_pb2.GenerateResponse]:
    responses = []
    while (response := await call.read()) != grpc.aio.EOF:
        responses.append(response)
    return responses


async def test_stream_reports_usage_and_length(engine):
    _, address = engine
    async with grpc.aio.insecure_channel(address) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        responses = [r async for r in stub.Generate(request("len", 5))]
    assert sum(len(r.token_ids) for r in responses) == 5
    assert responses[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert responses[-1].usage.completion_tokens == 5
    assert responses[-1].usage.prompt_tokens == 8


async def test_greedy_through_the_core_equals_transformers(engine, hf_greedy):
    _, address = engine
    greedy = request("greedy", 8, temperature=0.0)
    async with grpc.aio.insecure_channel(address) as channel:
        responses = await read_all(engine_pb2_grpc.EngineStub(channel).Generate(greedy))
    got = [t for r in responses for t in r.token_ids]
    assert got == hf_greedy(list(greedy.prompt_token_ids), 8)


async def test_metrics_of_the_core_are_served_by_the_worker(engine):
    process, address = engine
    metrics_port = process.argv[process.argv.index("--metrics-port") + 1]
    async with grpc.aio.insecure_channel(address) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        await read_all(stub.Generate(request("metrics", 5)))
    async with httpx.AsyncClient() as client:
        # The core sends its metrics once it is idle: bounded so a lost copy fails.
        for _ in range(100):
            text = (await client.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
            families = {f.name: f for f in text_string_to_metric_families(text)}
            tokens = families.get("maas_engine_generation_tokens")
            if tokens and tokens.samples[0].value >= 5:
                break
            await asyncio.sleep(0.1)
    assert tokens.samples[0].value >= 5
    # Served once: the worker records none of its own.
    assert text.count("# TYPE maas_engine_generation_tokens_total counter") == 1


@pytest.mark.parametrize(
    ("sampling", "words"),
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 17}, "n must be in"),
        ({"max_tokens": 9000}, "maximum context length"),
    ],
)
async def test_invalid_sampling_is_invalid_argument(engine, sampling, words):
    _, address = engine
    async with grpc.aio.insecure_channel(address) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in stub.Generate(request("bad", **{"max_tokens": 3, **sampling})):
                pass
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in caught.value.details()


async def test_abort_ends_running_and_queued_requests(engine):
    _, address = engine
    async with grpc.aio.insecure_channel(address) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)

        async def load_becomes(running: int, waiting: int):
            # Read from the engine's load, not from the streams: this client
            # leaves them unread until the aborts, and first messages can lag.
            for _ in range(300):
                load = await stub.GetLoad(engine_pb2.GetLoadRequest())
                if (load.running, load.waiting) == (running, waiting):
                    return
                await asyncio.sleep(0.1)
            raise AssertionError(f"load {load.running, load.waiting}, not {running, waiting}")

        # Two run together in one batch (max-num-seqs 2); the third, sent after, waits.
        calls = {rid: stub.Generate(request(rid, 500)) for rid in ("a", "b")}
        await load_becomes(2, 0)
        calls["c"] = stub.Generate(request("c", 500))
        await load_becomes(2, 1)
        # The queued one first: aborting a running one would let it in.
        for rid in ("c", "b", "a"):
            assert (await stub.Abort(engine_pb2.AbortRequest(request_id=rid))).found
        last = {rid: (await read_all(call))[-1] for rid, call in calls.items()}
        load = await stub.GetLoad(engine_pb2.GetLoadRequest())
    assert all(r.finish_reason == common_pb2.FINISH_REASON_ABORT for r in last.values())
    assert last["a"].usage.completion_tokens < 500
    assert last["c"].usage.completion_tokens == 0
    assert (load.running, load.waiting, load.kv_cache_usage) == (0, 0, 0.0)


async def test_kv_events_report_exactly_the_cached_prompt_blocks(engine):
    _, address = engine
    prompt = list(range(1000, 1000 + 16 * 5 + 3))  # five full blocks and a tail
    async with grpc.aio.insecure_channel(address) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        events = stub.StreamKvEvents(engine_pb2.KvEventsRequest())
        snapshot = await events.read()
        assert snapshot.events[0].kind == engine_pb2.KvEvent.KIND_CLEARED
        known = set(snapshot.events[1].block_hashes)
        generate = engine_pb2.GenerateRequest(
            request_id="kv",
            model=DEFAULT_MODEL_ID,
            prompt_token_ids=prompt,
            sampling=engine_pb2.SamplingParams(max_tokens=2, ignore_eos=True),
        )
        await read_all(stub.Generate(generate))
        stored: set[int] = set()
        salt = request_salt(DEFAULT_MODEL_ID, "tenant", "", False)
        expected = set(prefix_block_hashes(prompt, 16, salt)) - known
        while not expected <= stored:
            batch = await asyncio.wait_for(events.read(), timeout=30)
            assert batch.sequence > snapshot.sequence
            for event in batch.events:
                if event.kind == engine_pb2.KvEvent.KIND_STORED:
                    stored.update(event.block_hashes)
        events.cancel()
    assert len(expected) == 5


async def test_a_router_indexes_and_loads_this_engine_across_the_core(engine, tmp_path):
    _, address = engine
    port = free_port()
    router = ManagedProcess(
        "router",
        serve_argv(
            "router", {"port": port, "metrics-port": free_port(), "engines": f"e0={address}"}
        ),
        tmp_path / "router.log",
    )
    router.start()
    prompt = list(range(3000, 3000 + 16 * 6))  # six full blocks
    try:
        await wait_ready(router, f"127.0.0.1:{port}", timeout=60)
        async with grpc.aio.insecure_channel(address) as channel:
            stub = engine_pb2_grpc.EngineStub(channel)
            generate = engine_pb2.GenerateRequest(
                request_id="indexed",
                prompt_token_ids=prompt,
                sampling=engine_pb2.SamplingParams(max_tokens=1),
            )
            await read_all(stub.Generate(generate))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            pool = router_pb2_grpc.RouterStub(channel)
            # Bounded only so that a router that never hears of the blocks fails.
            for _ in range(300):
                stats = await pool.GetPoolStats(router_pb2.PoolStatsRequest())
                (replica,) = [r for d in stats.deployments for r in d.replicas]
                if replica.kv_events_live and replica.indexed_blocks >= 6:
                    break
                await asyncio.sleep(0.1)
    finally:
        router.stop(timeout=10)
    assert replica.kv_events_live and replica.indexed_blocks >= 6
    assert (replica.ready, replica.max_num_seqs, replica.block_size) == (True, 2, 16)


async def test_sigterm_finishes_in_flight_then_exits(engine):
    process, address = engine
    async with grpc.aio.insecure_channel(address) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        stream = stub.Generate(request("inflight", 20))
        await stream.read()
        process.process.send_signal(signal.SIGTERM)
        rest = await read_all(stream)
        assert sum(len(r.token_ids) for r in rest) == 19
        assert rest[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert await asyncio.to_thread(process.process.wait, 30) == 0
