"""LoRA adapters through the vLLM backend answer as on our engine: LoadAdapter and
UnloadAdapter through vLLM's runtime API, a Generate naming one runs with it,
GetLoad says what vLLM holds, and the refusals carry engine.proto's codes.

A vLLM server of its own: LoRA on (--enable-lora and its limits, as the
operator passes them) and its runtime API allowed (VLLM_ALLOW_RUNTIME_LORA_UPDATING,
which VllmConfig sets with --enable-lora).
"""

import asyncio
import json

import grpc
import pytest

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_services.common.model_files import default_model_path
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_tools.local.readiness import StartupError, wait_ready
from maas_tools.peers.vllm_server import VllmServer
from tests.integration.router.conftest import eventually
from tests.integration.vllm.conftest import (
    adapter_process,
    generate_request,
    vllm_config,
)

pytestmark = pytest.mark.slow

MAX_LORAS = 2
LORA_ARGS = ["--enable-lora", f"--max-loras={MAX_LORAS}", "--max-lora-rank=8", "--max-cpu-loras=2"]


@pytest.fixture(scope="module")
def lora_vllm(vllm_python, tmp_path_factory):
    """One vLLM with LoRA for the module: its start is the slow part."""
    config = vllm_config(vllm_python, *LORA_ARGS)
    logs = tmp_path_factory.mktemp("vllm-lora")
    # --enable-lora: VllmConfig.env() allows vLLM's runtime LoRA API too.
    server = VllmServer(config, logs / "vllm.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def lora_adapter_address(lora_vllm, tmp_path_factory):
    process, address = adapter_process(lora_vllm, tmp_path_factory.mktemp("adapter"))
    try:
        process.start()
        asyncio.run(wait_ready(process, address, timeout=120))
        yield address
    finally:
        process.stop(timeout=30)


@pytest.fixture
async def lora_stub(lora_adapter_address):
    async with grpc.aio.insecure_channel(lora_adapter_address) as channel:
        yield engine_pb2_grpc.EngineStub(channel)


async def text_of(stub, request) -> str:
    return "".join([r.text async for r in stub.Generate(request)])


async def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code()


async def test_adapters_load_serve_and_unload_as_on_our_engine(
    lora_stub, lora_adapter_dir, tmp_path
):
    stub = lora_stub
    tokenizer = load_tokenizer(default_model_path())
    prompt = tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])

    def ask(request_id: str, adapter: str = ""):
        request = generate_request(request_id, prompt, max_tokens=12, temperature=0.0)
        request.adapter = adapter
        return request

    load = await stub.GetLoad(engine_pb2.GetLoadRequest())
    assert (load.max_loras, list(load.adapters)) == (MAX_LORAS, [])

    # The same load from many callers at once: one adapter, every caller answered.
    source = str(lora_adapter_dir)
    statuses = await asyncio.gather(
        *(
            stub.LoadAdapter(engine_pb2.LoadAdapterRequest(name="upper", source=source))
            for _ in range(8)
        )
    )
    assert {(s.name, s.rank, s.source) for s in statuses} == {("upper", 8, source)}
    await eventually(
        lambda: _adapters(stub, ["upper"]), timeout=10, what="GetLoad lists the adapter"
    )

    base = await text_of(stub, ask("base"))
    tuned = await text_of(stub, ask("tuned", "upper"))
    assert tuned != base
    assert tuned.strip() and tuned == tuned.upper()

    # Refusals, each costing only its caller: the adapter and the base still serve.
    assert await code_of(stub.Generate(ask("missing", "nope")).read()) == grpc.StatusCode.NOT_FOUND
    other = engine_pb2.LoadAdapterRequest(name="upper", source=str(tmp_path))
    assert await code_of(stub.LoadAdapter(other)) == grpc.StatusCode.INVALID_ARGUMENT
    (tmp_path / "adapter_config.json").write_text("{not json")
    broken = engine_pb2.LoadAdapterRequest(name="broken", source=str(tmp_path))
    assert await code_of(stub.LoadAdapter(broken)) == grpc.StatusCode.INVALID_ARGUMENT
    assert await text_of(stub, ask("tuned-again", "upper")) == tuned
    assert await text_of(stub, ask("base-again")) == base

    unload = engine_pb2.UnloadAdapterRequest(name="upper")
    assert (await stub.UnloadAdapter(unload)).found
    assert not (await stub.UnloadAdapter(unload)).found
    assert await code_of(stub.Generate(ask("gone", "upper")).read()) == grpc.StatusCode.NOT_FOUND
    await eventually(lambda: _adapters(stub, []), timeout=10, what="GetLoad lists none")


async def _adapters(stub, names: list[str]) -> bool:
    return list((await stub.GetLoad(engine_pb2.GetLoadRequest())).adapters) == names


async def test_preload_adapters_from_maas_lora_modules_are_held_before_the_adapter_is_ready(
    lora_vllm, lora_adapter_dir, tmp_path
):
    """As an engine pod starts: MAAS_LORA_MODULES, from the operator's adapters
    ConfigMap. vLLM holds the adapter by the time the adapter first reports ready,
    and a request naming it runs with it; a folder vLLM refuses fails the start
    with vLLM's reason, as on our engine."""
    process, address = adapter_process(lora_vllm, tmp_path / "preloaded")
    process.env["MAAS_LORA_MODULES"] = json.dumps([f"preloaded={lora_adapter_dir}"])
    process.start()
    try:
        await wait_ready(process, address, timeout=120)
        async with grpc.aio.insecure_channel(address) as channel:
            stub = engine_pb2_grpc.EngineStub(channel)
            load = await stub.GetLoad(engine_pb2.GetLoadRequest())
            assert list(load.adapters) == ["preloaded"], "held at the first poll after ready"
            tokenizer = load_tokenizer(default_model_path())
            prompt = tokenizer.encode_chat([{"role": "user", "content": "Name a colour."}])
            request = generate_request("preloaded", prompt, max_tokens=12, temperature=0.0)
            request.adapter = "preloaded"
            tuned = await text_of(stub, request)
            assert tuned.strip() and tuned == tuned.upper()
            # vLLM is the module's: leave it holding nothing, as the other test expects.
            unload = engine_pb2.UnloadAdapterRequest(name="preloaded")
            assert (await stub.UnloadAdapter(unload)).found
    finally:
        process.stop(timeout=30)

    refused, address = adapter_process(lora_vllm, tmp_path / "refused")
    refused.env["MAAS_LORA_MODULES"] = json.dumps([f"broken={tmp_path / 'no-such-folder'}"])
    refused.start()
    try:
        with pytest.raises(StartupError, match="exited with code 1") as caught:
            await wait_ready(refused, address, timeout=120)
        assert "engine_lora_module_failed" in str(caught.value)
        assert "no-such-folder" in str(caught.value)
    finally:
        refused.stop(timeout=30)


async def test_loads_and_unloads_are_kv_events_and_the_snapshot_lists_the_adapters(
    lora_stub, lora_adapter_dir
):
    """A subscriber's first batch lists what vLLM holds; each LoadAdapter and
    UnloadAdapter that succeeded follows as KIND_ADAPTER_LOADED / _UNLOADED."""
    stub, source = lora_stub, str(lora_adapter_dir)
    kind = engine_pb2.KvEvent.Kind

    async def next_adapter_events(events) -> list[tuple[int, str]]:
        while True:  # block events of other requests may come between
            batch = await asyncio.wait_for(events.read(), 60)
            if changed := [(e.kind, e.adapter) for e in batch.events if e.adapter]:
                return changed

    await stub.LoadAdapter(engine_pb2.LoadAdapterRequest(name="held", source=source))
    events = stub.StreamKvEvents(engine_pb2.KvEventsRequest())
    try:
        snapshot = await asyncio.wait_for(events.read(), 60)
        assert snapshot.events[0].kind == kind.KIND_CLEARED
        assert [(e.kind, e.adapter) for e in snapshot.events if e.adapter] == [
            (kind.KIND_ADAPTER_LOADED, "held")
        ]
        await stub.LoadAdapter(engine_pb2.LoadAdapterRequest(name="sql", source=source))
        assert await next_adapter_events(events) == [(kind.KIND_ADAPTER_LOADED, "sql")]
        for name in ("missing", "sql", "held"):  # not found: no event
            await stub.UnloadAdapter(engine_pb2.UnloadAdapterRequest(name=name))
        assert await next_adapter_events(events) == [(kind.KIND_ADAPTER_UNLOADED, "sql")]
        assert await next_adapter_events(events) == [(kind.KIND_ADAPTER_UNLOADED, "held")]
    finally:
        events.cancel()
