"""`maas serve engine --http-port`: the OpenAI HTTP front and the model-server protocol's metrics.

One real engine (SmolLM2, float32, two sequences a batch) with the service
token set, as a Gateway API Inference Extension gateway would reach it: the
front must answer chat and text completions (streamed and not) as the gRPC
path computes them, refuse callers without the token and bodies over the
limit with OpenAI errors, export every series the protocol requires, moving
with the engine's load, abort the work of a client that leaves, and drain on
SIGTERM as the gRPC side does. Embeddings: the vectors the gRPC path computes,
in both encodings, a list of the largest size a few inputs at a time, and an
engine started to serve only one kind refusing the other.
"""

import asyncio
import base64
import json
import signal
from dataclasses import dataclass

import grpc
import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_services.common.openai_api.embeddings import IN_FLIGHT, MAX_INPUTS
from maas_services.common.service_token import METADATA_KEY
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready

pytestmark = pytest.mark.slow

TOKEN = "front-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_BODY = 64 * 1024
BLOCK_SIZE = 16
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# Every series docs/proposals/003-model-server-protocol asks of a model server.
PROTOCOL_GAUGES = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:lora_requests_info",
)


@dataclass(frozen=True)
class Engine:
    http: str  # the front's base URL
    grpc: str  # the gRPC server's address
    metrics: str  # the metrics port's /metrics URL


def start_engine(log_dir, **more_flags) -> tuple[ManagedProcess, Engine]:
    port, http_port, metrics_port = free_port(), free_port(), free_port()
    flags = {
        **more_flags,
        "port": port,
        "metrics-port": metrics_port,
        "http-port": http_port,
        "http-max-body-bytes": MAX_BODY,
        "dtype": "float32",
        "max-num-seqs": 2,
        "block-size": BLOCK_SIZE,
    }
    process = ManagedProcess(
        "engine",
        serve_argv("engine", flags),
        log_dir / "engine.log",
        env={"MAAS_SERVICE_TOKEN": TOKEN},
    )
    process.start()
    address = f"127.0.0.1:{port}"
    asyncio.run(wait_ready(process, address, timeout=300))
    urls = f"http://127.0.0.1:{http_port}", f"http://127.0.0.1:{metrics_port}/metrics"
    return process, Engine(urls[0], address, urls[1])


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    """One engine with the front on."""
    process, engine = start_engine(tmp_path_factory.mktemp("http-front"))
    yield engine
    process.stop(timeout=30)


@pytest.fixture(scope="module", params=["embed", "generate"])
def serving_one_kind(request, tmp_path_factory):
    """An engine with the front on started with --serves embed, then one with
    --serves generate: (what it serves, the engine)."""
    log_dir = tmp_path_factory.mktemp(f"http-front-{request.param}")
    process, engine = start_engine(log_dir, serves=request.param)
    yield request.param, engine
    process.stop(timeout=30)


def chat_body(**fields) -> dict:
    return {"model": DEFAULT_MODEL_ID, "messages": QUESTION, "temperature": 0, **fields}


async def grpc_greedy_text(address: str, prompt_ids: list[int], max_tokens: int) -> str:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        call = stub.Generate(
            engine_pb2.GenerateRequest(
                request_id="grpc-twin",
                prompt_token_ids=prompt_ids,
                sampling=engine_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0),
            ),
            metadata=((METADATA_KEY, TOKEN),),
        )
        return "".join([r.text async for r in call])


async def test_chat_answers_as_the_grpc_path_computes(front, tokenizer):
    base, address = front.http, front.grpc
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        reply = await client.post(
            "/v1/chat/completions", json=chat_body(max_tokens=8), headers=AUTH
        )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == DEFAULT_MODEL_ID
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    # The prompt is the one the tokenizer service renders for the gateway.
    prompt_ids = tokenizer.encode_chat(QUESTION)
    assert choice["message"]["content"] == await grpc_greedy_text(address, prompt_ids, 8)
    assert body["usage"]["prompt_tokens"] == len(prompt_ids)
    assert 0 < body["usage"]["completion_tokens"] <= 8


async def test_stream_sends_the_same_text_in_chunks(front):
    base = front.http
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        whole = await client.post(
            "/v1/chat/completions", json=chat_body(max_tokens=8), headers=AUTH
        )
        streamed = chat_body(max_tokens=8, stream=True, stream_options={"include_usage": True})
        async with client.stream(
            "POST", "/v1/chat/completions", json=streamed, headers=AUTH
        ) as reply:
            assert reply.status_code == 200
            assert reply.headers["content-type"].startswith("text/event-stream")
            frames = [line async for line in reply.aiter_lines() if line.startswith("data: ")]
    assert frames[-1] == "data: [DONE]"
    chunks = [json.loads(frame.removeprefix("data: ")) for frame in frames[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == whole.json()["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"]["completion_tokens"] == whole.json()["usage"]["completion_tokens"]


async def test_text_completion_and_models(front):
    base = front.http
    async with httpx.AsyncClient(base_url=base, timeout=120, headers=AUTH) as client:
        reply = await client.post(
            "/v1/completions",
            json={"model": DEFAULT_MODEL_ID, "prompt": "The capital of France is", "max_tokens": 4},
        )
        models = await client.get("/v1/models")
    assert reply.status_code == 200, reply.text
    assert reply.json()["object"] == "text_completion"
    assert reply.json()["choices"][0]["text"]
    assert [m["id"] for m in models.json()["data"]] == [DEFAULT_MODEL_ID]


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}]
)
async def test_callers_without_the_token_get_401(front, headers):
    base = front.http
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        chat = await client.post("/v1/chat/completions", json=chat_body(), headers=headers)
        models = await client.get("/v1/models", headers=headers)
        # What an endpoint picker reads stays open.
        metrics = await client.get("/metrics", headers=headers)
        health = await client.get("/health", headers=headers)
    for reply in (chat, models):
        assert reply.status_code == 401
        assert reply.json()["error"]["code"] == "invalid_api_key"
    assert metrics.status_code == 200
    assert health.status_code == 200


async def test_oversized_bodies_get_413(front):
    base = front.http
    big = chat_body(messages=[{"role": "user", "content": "x" * (2 * MAX_BODY)}])
    async with httpx.AsyncClient(base_url=base, timeout=30, headers=AUTH) as client:
        declared = await client.post("/v1/chat/completions", json=big)

        async def chunks():
            # No Content-Length: cut off once the bytes read pass the limit.
            payload = json.dumps(big).encode()
            for start in range(0, len(payload), 16 * 1024):
                yield payload[start : start + 16 * 1024]

        chunked = await client.post(
            "/v1/chat/completions", content=chunks(), headers={"Content-Type": "application/json"}
        )
    for reply in (declared, chunked):
        assert reply.status_code == 413
        assert reply.json()["error"]["code"] == "request_too_large"


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "could not parse"),
        (json.dumps(chat_body(model="another-model")).encode(), 404, "another-model"),
        (json.dumps(chat_body(temperature=5)).encode(), 400, "temperature"),
        (json.dumps(chat_body(max_tokens=100_000)).encode(), 400, "maximum context length"),
    ],
)
async def test_bad_requests_get_openai_errors(front, body, status, words):
    base = front.http
    async with httpx.AsyncClient(base_url=base, timeout=30, headers=AUTH) as client:
        reply = await client.post(
            "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}
        )
    assert reply.status_code == status
    assert words in reply.json()["error"]["message"]


async def scrape(client: httpx.AsyncClient) -> dict:
    text = (await client.get("/metrics")).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def gauge(families: dict, name: str) -> float:
    [sample] = families[name].samples
    return sample.value


async def test_protocol_metrics_are_exported_and_follow_the_load(front):
    base = front.http
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        families = await scrape(client)
        for name in PROTOCOL_GAUGES:
            assert families[name].type == "gauge", name
        [config] = families["vllm:cache_config_info"].samples
        assert config.labels["block_size"] == str(BLOCK_SIZE)
        slots = int(config.labels["num_gpu_blocks"]) * BLOCK_SIZE
        assert slots > 0
        [lora] = families["vllm:lora_requests_info"].samples
        assert lora.labels == {
            "max_lora": "8",  # --max-loras' default; no adapter loaded
            "running_lora_adapters": "",
            "waiting_lora_adapters": "",
        }
        for name in PROTOCOL_GAUGES[:3]:
            [sample] = families[name].samples
            assert sample.labels == {"model_name": DEFAULT_MODEL_ID}

        # Three long requests on a batch of two: two run, one waits, blocks fill;
        # too long to end by themselves within the polls below. One streams, one
        # waits for its whole answer, one for either.
        # Each fits the KV pool (whatever the CPU class's weight copies leave of the
        # tests' 1 GiB budget), two do not.
        long = chat_body(max_tokens=slots * 3 // 4, ignore_eos=True)
        streams = [
            asyncio.create_task(
                client.post("/v1/chat/completions", json={**long, "stream": stream}, headers=AUTH)
            )
            for stream in (True, False, True)
        ]
        loaded = None
        for _ in range(600):
            families = await scrape(client)
            load = [gauge(families, name) for name in PROTOCOL_GAUGES[:3]]
            if load[0] >= 1 and load[1] == 2 and load[2] > 0:
                loaded = load
                break
            await asyncio.sleep(0.1)
        assert loaded is not None, f"the gauges never showed the load: {load}"
        # The clients leave: the engine aborts their requests and the gauges fall back.
        for stream in streams:
            stream.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
        for _ in range(600):
            families = await scrape(client)
            load = [gauge(families, name) for name in PROTOCOL_GAUGES[:3]]
            if load == [0, 0, 0]:
                break
            await asyncio.sleep(0.1)
        assert load == [0, 0, 0]


async def test_logprobs_guided_choice_and_a_forced_tool_call(front):
    base = front.http
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20}},
                "required": ["city"],
            },
        },
    }
    async with httpx.AsyncClient(base_url=base, timeout=300, headers=AUTH) as client:
        scored = await client.post(
            "/v1/chat/completions", json=chat_body(max_tokens=3, logprobs=True, top_logprobs=2)
        )
        chosen = await client.post(
            "/v1/chat/completions", json=chat_body(max_tokens=8, guided_choice=["Paris", "Rome"])
        )
        called = await client.post(
            "/v1/chat/completions",
            json=chat_body(
                max_tokens=100,
                tools=[weather],
                tool_choice={"type": "function", "function": {"name": "get_weather"}},
            ),
        )
    content = scored.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == scored.json()["usage"]["completion_tokens"]
    assert all(len(entry["top_logprobs"]) == 2 for entry in content)
    assert chosen.json()["choices"][0]["message"]["content"] in ("Paris", "Rome")
    choice = called.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", called.text
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert "city" in json.loads(call["function"]["arguments"])


async def test_the_metrics_port_exports_the_protocol_series_too(front):
    async with httpx.AsyncClient(timeout=30) as client:
        text = (await client.get(front.metrics)).text
    families = {f.name for f in text_string_to_metric_families(text)}
    assert set(PROTOCOL_GAUGES) <= families


async def test_answers_are_counted_by_route_and_status(front):
    async with httpx.AsyncClient(base_url=front.http, timeout=30) as client:
        await client.post("/v1/chat/completions", json=chat_body())
        await client.get("/no/such/path", headers=AUTH)
        families = await scrape(client)
    counted = {
        (s.labels["route"], s.labels["status"]): s.value
        for s in families["maas_engine_http_responses"].samples
        if s.name.endswith("_total")
    }
    assert counted[("/v1/chat/completions", "401")] >= 1
    assert counted[("other", "404")] >= 1


async def asked(request) -> int | str:
    """A request's status, or "refused" when the server no longer takes connections."""
    try:
        reply = await request
    except (httpx.ConnectError, httpx.RemoteProtocolError):
        return "refused"
    return reply.status_code


def test_a_draining_engine_finishes_its_streams_and_takes_nothing_new(tmp_path):
    process, engine = start_engine(tmp_path)
    body = chat_body(max_tokens=40, ignore_eos=True, stream=True)

    async def drain():
        async with httpx.AsyncClient(base_url=engine.http, timeout=120, headers=AUTH) as client:

            async def stream() -> list[str]:
                async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
                    return [line async for line in reply.aiter_lines() if line.startswith("data")]

            streaming = asyncio.create_task(stream())
            # Under way: the engine is running it.
            while gauge(await scrape(client), "vllm:num_requests_running") < 1:
                await asyncio.sleep(0.05)
            process.process.send_signal(signal.SIGTERM)
            # New work is refused: a 503 while the front's requests run, then no
            # connection at all once it has stopped listening (both mean "not here").
            while (health := await asked(client.get("/health"))) == 200:
                await asyncio.sleep(0.05)
            refused = await asked(client.post("/v1/chat/completions", json=chat_body(max_tokens=2)))
            return health, refused, await streaming

    try:
        health, refused, frames = asyncio.run(drain())
        assert process.process.wait(timeout=60) == 0
    finally:
        process.stop(timeout=30)
    # The stream was still running when health was asked: the front was listening.
    assert health == 503
    assert refused in (503, "refused")
    assert frames[-1] == "data: [DONE]"
    # The role chunk, forty tokens, then [DONE].
    assert len(frames) == 42


async def grpc_embedding(address: str, prompt_ids: list[int], dimensions: int = 0) -> list[float]:
    async with grpc.aio.insecure_channel(address) as channel:
        call = engine_pb2_grpc.EngineStub(channel).Generate(
            engine_pb2.GenerateRequest(
                request_id="grpc-embedding",
                prompt_token_ids=prompt_ids,
                sampling=engine_pb2.SamplingParams(
                    embedding=engine_pb2.Embedding(dimensions=dimensions)
                ),
            ),
            metadata=((METADATA_KEY, TOKEN),),
        )
        (response,) = [r async for r in call]
    return list(response.embedding)


def embeddings_body(inputs, **fields) -> dict:
    return {"model": DEFAULT_MODEL_ID, "input": inputs, **fields}


async def test_embeddings_are_the_vectors_the_grpc_path_computes(front, tokenizer):
    texts = ["The capital of France is Paris.", "hello"]
    ids = [1, 9690, 198, 19556, 451, 253, 1345, 30]
    async with httpx.AsyncClient(base_url=front.http, timeout=120, headers=AUTH) as client:
        of_texts = await client.post("/v1/embeddings", json=embeddings_body(texts))
        of_ids = await client.post("/v1/embeddings", json=embeddings_body(ids, dimensions=32))
    assert of_texts.status_code == 200, of_texts.text
    body = of_texts.json()
    assert body["object"] == "list" and body["model"] == DEFAULT_MODEL_ID
    assert [item["index"] for item in body["data"]] == [0, 1]
    # Encoded as the tokenizer service encodes a text prompt for the gateway.
    encoded = [tokenizer.encode(text, add_special_tokens=True) for text in texts]
    for item, prompt_ids in zip(body["data"], encoded, strict=True):
        expected = await grpc_embedding(front.grpc, prompt_ids)
        assert item["embedding"] == pytest.approx(expected, abs=1e-5)
    prompt_tokens = sum(len(prompt_ids) for prompt_ids in encoded)
    assert body["usage"] == {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    assert of_ids.status_code == 200, of_ids.text
    [item] = of_ids.json()["data"]
    assert item["embedding"] == pytest.approx(await grpc_embedding(front.grpc, ids, 32), abs=1e-5)


async def test_base64_embeddings_decode_to_the_float_answer(front):
    async with httpx.AsyncClient(base_url=front.http, timeout=120, headers=AUTH) as client:
        floats = await client.post("/v1/embeddings", json=embeddings_body("hello there"))
        packed = await client.post(
            "/v1/embeddings", json=embeddings_body("hello there", encoding_format="base64")
        )
    assert packed.status_code == 200, packed.text
    [item] = packed.json()["data"]
    # As OpenAI's SDK decodes it: little-endian float32.
    vector = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
    expected = floats.json()["data"][0]["embedding"]
    assert vector.tolist() == pytest.approx(expected, abs=1e-6)
    assert len(vector) == len(expected) == 576


@pytest.mark.parametrize(
    ("inputs", "fields", "param", "words"),
    [
        ([f"input {i}" for i in range(MAX_INPUTS + 1)], {}, "input", f"at most {MAX_INPUTS}"),
        (["fine", [1, 2]], {}, "input", "input must be"),
        ("", {}, "input", "empty string"),
        (["fine", "x" * 60_000], {}, "input", "input[1]: This model's maximum context length"),
        ("hello", {"dimensions": 577}, "dimensions", "embedding.dimensions must be in [1, 576]"),
    ],
)
async def test_bad_embedding_requests_get_a_400_naming_the_field(
    front, inputs, fields, param, words
):
    async with httpx.AsyncClient(base_url=front.http, timeout=60, headers=AUTH) as client:
        reply = await client.post("/v1/embeddings", json=embeddings_body(inputs, **fields))
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param
    assert words in error["message"]


async def in_engine(client: httpx.AsyncClient) -> float:
    """The engine's requests, waiting and running."""
    families = await scrape(client)
    return gauge(families, "vllm:num_requests_waiting") + gauge(
        families, "vllm:num_requests_running"
    )


async def test_the_largest_list_goes_a_few_inputs_at_a_time_and_its_client_can_leave(front):
    """2048 inputs hold at most IN_FLIGHT places in the engine: another caller's
    chat is answered as it is alone while the list runs, and the list's work
    ends when its client leaves."""
    # Within the front's body limit.
    largest = embeddings_body([f"item {i}" for i in range(MAX_INPUTS)])
    async with httpx.AsyncClient(base_url=front.http, timeout=300, headers=AUTH) as client:
        alone = await client.post("/v1/chat/completions", json=chat_body(max_tokens=8))
        listing = asyncio.create_task(client.post("/v1/embeddings", json=largest))
        while await in_engine(client) == 0:  # the list under way
            assert not listing.done(), listing.result().text
            await asyncio.sleep(0.05)
        beside = asyncio.create_task(
            client.post("/v1/chat/completions", json=chat_body(max_tokens=8))
        )
        peak = 0.0
        while not beside.done():
            peak = max(peak, await in_engine(client))
            await asyncio.sleep(0.05)
        listed_throughout = not listing.done()
        listing.cancel()
        await asyncio.gather(listing, return_exceptions=True)
        for _ in range(600):
            if (left := await in_engine(client)) == 0:
                break
            await asyncio.sleep(0.1)
    assert listed_throughout
    assert (await beside).json()["choices"] == alone.json()["choices"]
    # The list's inputs in flight, and the chat beside them.
    assert 1 < peak <= IN_FLIGHT + 1
    assert left == 0


async def test_an_engine_serving_one_kind_refuses_the_other_with_a_400(serving_one_kind):
    serves, engine = serving_one_kind
    async with httpx.AsyncClient(base_url=engine.http, timeout=120, headers=AUTH) as client:
        chat = await client.post("/v1/chat/completions", json=chat_body(max_tokens=2))
        text = await client.post(
            "/v1/completions", json={"model": DEFAULT_MODEL_ID, "prompt": "Hi", "max_tokens": 2}
        )
        embedded = await client.post("/v1/embeddings", json=embeddings_body("hello"))
    refused, served = (
        ([chat, text], [embedded]) if serves == "embed" else ([embedded], [chat, text])
    )
    for reply in refused:
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["type"] == "invalid_request_error"
        only = "embeddings" if serves == "embed" else "generation"
        assert f"This model serves {only}" in error["message"]
        assert f"--serves {serves}" in error["message"]
    for reply in served:
        assert reply.status_code == 200, reply.text
