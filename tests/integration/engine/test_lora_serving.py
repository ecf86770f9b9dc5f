"""LoRA adapters on a served engine (`maas serve engine`), over real gRPC.

One engine (SmolLM2, float32, two sequences a batch, two adapters a step, three
kept loaded) started with an adapter from --lora-modules: the adapter trained by
tests/lora_fixture.py (it answers in upper case). Loaded by flag and by
LoadAdapter, it changes greedy output; unloaded, a Generate naming it is
NOT_FOUND; bad folders are INVALID_ARGUMENT and leave the engine serving; a full
engine is RESOURCE_EXHAUSTED, then makes room by evicting the least recently
used idle adapter; an engine with --max-loras 0 answers loads and requests
naming an adapter with FAILED_PRECONDITION; a bad
--lora-modules fails the start with its reason in the log. The worst case: a
caller loading and unloading adapters in a loop from several tasks while another
generates on the base model, whose answers must be exactly what they are alone.
"""

import asyncio
import json
import shutil
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

import maas_tools.local.up
from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_services.common.settings import parse_settings
from maas_services.engine.settings import EngineSettings
from maas_tools.cli import main as maas
from maas_tools.cli import repeated_flags
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import StartupError, wait_ready

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PINNED = "shared"  # the --lora-modules adapter
MAX_LORAS, MAX_CPU_LORAS = 2, 3


def start_engine(log_dir: Path, **flags) -> tuple[ManagedProcess, str, str]:
    """A `maas serve engine` process, not yet waited for: (process, address, metrics URL)."""
    port, metrics_port = free_port(), free_port()
    flags = {"port": port, "metrics-port": metrics_port, "dtype": "float32", **flags}
    process = ManagedProcess("engine", serve_argv("engine", flags), log_dir / "engine.log")
    process.start()
    return process, f"127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"


@pytest.fixture(scope="module")
def engine(tmp_path_factory, lora_adapter_dir):
    """(address, metrics URL) of the engine this module shares."""
    process, address, metrics = start_engine(
        tmp_path_factory.mktemp("lora-engine"),
        **{
            "max-num-seqs": 2,
            "max-loras": MAX_LORAS,
            "max-cpu-loras": MAX_CPU_LORAS,
            "lora-modules": [f"{PINNED}={lora_adapter_dir}"],
        },
    )
    asyncio.run(wait_ready(process, address, timeout=300))
    yield address, metrics
    process.stop(timeout=30)


@pytest.fixture
async def stub(engine):
    async with grpc.aio.insecure_channel(engine[0]) as channel:
        yield engine_pb2_grpc.EngineStub(channel)


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:
    return tokenizer.encode_chat(QUESTION)


def bad_folder(good: Path, where: Path, kind: str) -> Path:
    """A copy of the good adapter spoiled one way."""
    folder = where / kind
    shutil.copytree(good, folder)
    config_path, weights = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    config = json.loads(config_path.read_text())
    if kind == "rank_too_high":
        config["r"] = 64  # above the default --max-lora-rank 16
    elif kind == "unknown_target":
        config["target_modules"] = ["q_proj", "lm_head_proj"]
    elif kind == "missing_weights":
        weights.unlink()
    elif kind == "corrupt_weights":
        weights.write_bytes(b"\x40\x00\x00\x00\x00\x00\x00\x00{this is not a safetensors header")
    elif kind == "whole_model":
        with weights.open("r+b") as file:
            file.truncate(4 << 30)  # sparse: no disk, and never read
    config_path.write_text(json.dumps(config))
    return folder


async def generate(stub, request_id, prompt, adapter="", max_tokens=12) -> str:
    call = stub.Generate(
        engine_pb2.GenerateRequest(
            request_id=request_id,
            prompt_token_ids=prompt,
            sampling=engine_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0),
            adapter=adapter,
        )
    )
    return "".join([response.text async for response in call])


async def load(stub, name: str, source: Path) -> engine_pb2.AdapterStatus:
    return await stub.LoadAdapter(engine_pb2.LoadAdapterRequest(name=name, source=str(source)))


async def unload(stub, name: str) -> bool:
    return (await stub.UnloadAdapter(engine_pb2.UnloadAdapterRequest(name=name))).found


async def loaded(stub) -> list[str]:
    return list((await stub.GetLoad(engine_pb2.GetLoadRequest())).adapters)


async def scrape(url: str) -> dict:
    async with httpx.AsyncClient(timeout=30) as client:
        text = (await client.get(url)).text
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_maas_up_passes_lora_modules_to_every_engine(monkeypatch, capsys):
    configs = []
    monkeypatch.setattr(maas_tools.local.up, "up", lambda config, model: configs.append(config))
    with pytest.raises(SystemExit):
        maas(["up", "--lora-modules", "a=/x", "b=/y", "--dtype", "float32"])
    assert (configs[0].lora_modules, configs[0].engine_args) == (
        ["a=/x", "b=/y"],
        ["--dtype", "float32"],
    )
    with pytest.raises(SystemExit) as refused:
        maas(["up", "--lora-modules", "a=/x", "a=/y"])
    assert refused.value.code == 2
    assert "given twice" in capsys.readouterr().err


def test_lora_modules_take_vllm_spelling():
    argv = repeated_flags(["--lora-modules", "a=/x", "b=/y", "--max-loras", "2"])
    settings = parse_settings(EngineSettings, argv, prog="maas serve engine")
    assert settings.lora_module_sources == {"a": "/x", "b": "/y"}
    with pytest.raises(ValueError, match="given twice"):
        EngineSettings(lora_modules=["a=/x", "a=/y"])
    with pytest.raises(ValueError, match="NAME=PATH"):
        EngineSettings(lora_modules=["/x"])


async def test_lora_modules_are_loaded_at_start_and_reported(stub, prompt):
    report = await stub.GetLoad(engine_pb2.GetLoadRequest())
    assert list(report.adapters) == [PINNED]
    assert report.max_loras == MAX_LORAS
    base = await generate(stub, "base", prompt)
    tuned = await generate(stub, "tuned", prompt, adapter=PINNED)
    # The adapter answers in upper case; the base model does not.
    assert tuned != base
    assert tuned == tuned.upper() and any(c.isalpha() for c in tuned)


async def test_load_generate_unload(stub, prompt, lora_adapter_dir, tmp_path):
    status = await load(stub, "upper", lora_adapter_dir)
    assert (status.name, status.rank, status.source) == ("upper", 8, str(lora_adapter_dir))
    # The same name and source again: the same answer, nothing reloaded.
    assert await load(stub, "upper", lora_adapter_dir) == status
    assert "upper" in await loaded(stub)
    assert await generate(stub, "a", prompt, "upper") == await generate(stub, "b", prompt, PINNED)
    # The name taken by another folder: refused, the loaded one kept.
    other = shutil.copytree(lora_adapter_dir, tmp_path / "other")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await load(stub, "upper", other)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await unload(stub, "upper")
    assert "upper" not in await loaded(stub)
    assert not await unload(stub, "upper")
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await generate(stub, "after-unload", prompt, "upper")
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    assert "upper" in gone.value.details()


async def test_an_adapter_never_loaded_is_not_found(stub, prompt):
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await generate(stub, "nowhere", prompt, "never-loaded")
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("rank_too_high", "max-lora-rank"),
        ("unknown_target", "lm_head_proj"),
        ("missing_weights", "missing"),
        ("corrupt_weights", "corrupt"),
        ("whole_model", "whole model"),
    ],
)
async def test_bad_adapters_are_invalid_and_harmless(
    stub, prompt, lora_adapter_dir, tmp_path, kind, words
):
    before = await loaded(stub)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await load(stub, f"bad-{kind}", bad_folder(lora_adapter_dir, tmp_path, kind))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in refused.value.details()
    assert await loaded(stub) == before
    assert await generate(stub, f"after-{kind}", prompt, PINNED)


@pytest.mark.parametrize("name", ["a,b", "two words", "x" * 300, "bell\x07"])
async def test_names_no_model_could_have_are_invalid(stub, lora_adapter_dir, name):
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await load(stub, name, lora_adapter_dir)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await loaded(stub) == [PINNED]


async def test_full_engine_refuses_then_evicts_the_least_recently_used(
    stub, engine, prompt, lora_adapter_dir
):
    metrics_url = engine[1]
    await load(stub, "first", lora_adapter_dir)
    await load(stub, "second", lora_adapter_dir)  # the pinned one, first, second: all three slots
    # The core's metrics come with the batch before each load's answer.
    families = await scrape(metrics_url)
    evictions_before = families["maas_engine_lora_adapter_evictions"]
    [cache] = families["vllm:cache_config_info"].samples
    slots = int(cache.labels["num_gpu_blocks"]) * int(cache.labels["block_size"])

    async def hold(adapter):
        call = stub.Generate(
            engine_pb2.GenerateRequest(
                request_id=f"hold-{adapter}",
                prompt_token_ids=prompt,
                # Long enough to hold its adapter through the test, short enough for the
                # KV pool (whatever the CPU class's weight copies leave of the budget).
                sampling=engine_pb2.SamplingParams(
                    max_tokens=slots - len(prompt) - 16, ignore_eos=True
                ),
                adapter=adapter,
            )
        )
        await call.read()  # running: it holds its adapter
        return call

    holders = [await hold("first"), await hold("second")]
    try:
        with pytest.raises(grpc.aio.AioRpcError) as full:
            await load(stub, "third", lora_adapter_dir)
        assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # As llm-d's LoRA affinity reads it: both adapters running, none waiting.
        families = await scrape(metrics_url)
        [info] = families["vllm:lora_requests_info"].samples
        assert info.labels["max_lora"] == str(MAX_LORAS)
        assert info.labels["running_lora_adapters"] == "first,second"
        assert info.labels["waiting_lora_adapters"] == ""
    finally:
        for call in holders:
            call.cancel()
    # Idle again: the least recently used of those loaded on demand makes room.
    for _ in range(100):
        try:
            await load(stub, "third", lora_adapter_dir)
            break
        except grpc.aio.AioRpcError as exc:  # the cancels are still on their way
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            await asyncio.sleep(0.1)
    assert await loaded(stub) == sorted([PINNED, "second", "third"])
    families = await scrape(metrics_url)
    evicted = families["maas_engine_lora_adapter_evictions"].samples[0].value
    assert evicted == evictions_before.samples[0].value + 1
    assert families["maas_engine_lora_adapters_loaded"].samples[0].value == 3
    for name in ("second", "third"):
        assert await unload(stub, name)


async def test_loads_in_a_loop_cost_only_their_sender(stub, engine, prompt, lora_adapter_dir):
    """The worst case: four tasks load and unload adapters as fast as the engine
    answers (each load evicting another) while four base-model requests run; the
    base requests' answers are exactly what they are alone, and the engine serves."""
    alone = await generate(stub, "alone", prompt, max_tokens=24)
    stop = asyncio.Event()

    async def churn(task: int) -> int:
        count = 0
        while not stop.is_set():
            name = f"churn-{task}-{count % 3}"
            try:
                await load(stub, name, lora_adapter_dir)
                await unload(stub, name)
            except grpc.aio.AioRpcError as exc:  # all slots loading at once: its own refusal
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            count += 1
        return count

    churners = [asyncio.create_task(churn(task)) for task in range(4)]
    victims = await asyncio.gather(
        *(generate(stub, f"victim-{i}", prompt, max_tokens=24) for i in range(4))
    )
    stop.set()
    rounds = await asyncio.gather(*churners)
    assert victims == [alone] * 4
    assert sum(rounds) >= 4  # the loads did run beside the victims
    async with grpc.aio.insecure_channel(engine[0]) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert await loaded(stub) == [PINNED]


async def test_an_engine_without_lora_refuses_loads(tmp_path, lora_adapter_dir, prompt):
    process, address, _ = start_engine(tmp_path, **{"max-loras": 0})
    try:
        await wait_ready(process, address, timeout=300)
        async with grpc.aio.insecure_channel(address) as channel:
            stub = engine_pb2_grpc.EngineStub(channel)
            report = await stub.GetLoad(engine_pb2.GetLoadRequest())
            assert (report.max_loras, list(report.adapters)) == (0, [])
            with pytest.raises(grpc.aio.AioRpcError) as disabled:
                await load(stub, "upper", lora_adapter_dir)
            assert disabled.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            with pytest.raises(grpc.aio.AioRpcError) as named:
                await generate(stub, "no-lora", prompt, "upper")
            assert named.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        process.stop(timeout=30)


async def test_a_bad_lora_module_fails_the_start(tmp_path, lora_adapter_dir):
    broken = bad_folder(lora_adapter_dir, tmp_path, "corrupt_weights")
    process, address, _ = start_engine(tmp_path, **{"lora-modules": [f"broken={broken}"]})
    try:
        with pytest.raises(StartupError):
            await wait_ready(process, address, timeout=300)
    finally:
        process.stop(timeout=30)
    log = (tmp_path / "engine.log").read_text()
    [line] = [line for line in log.splitlines() if "engine_lora_module_failed" in line]
    assert "broken" in line and "corrupt" in line
