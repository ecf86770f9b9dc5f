"""LoRA adapters through the vLLM backend answer as on our engine: LoadAdapter and
UnloadAdapter through vLLM's runtime API, a Generate naming one runs with it,
GetLoad says what vLLM holds, and the refusals carry engine.proto's codes.

A vLLM server of its own: LoRA on (--enable-lora and its limits, as the
operator passes them) and its runtime API allowed (VLLM_ALLOW_RUNTIME_LORA_UPDATING,
which VllmConfig sets with --enable-lora).
"""

import asyncio

import grpc
import pytest

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_services.common.model_files import default_model_path
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_tools.local.readiness import wait_ready
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
def lora_adapter_address(vllm_python, tmp_path_factory):
    config = vllm_config(vllm_python, *LORA_ARGS)
    logs = tmp_path_factory.mktemp("vllm-lora")
    # --enable-lora: VllmConfig.env() allows vLLM's runtime LoRA API too.
    server = VllmServer(config, logs / "vllm.log").start()
    process, address = adapter_process(server, logs)
    try:
        process.start()
        asyncio.run(wait_ready(process, address, timeout=120))
        yield address
    finally:
        process.stop(timeout=30)
        server.stop()


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
