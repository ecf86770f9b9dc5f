"""kill -9 of a real engine under a stream: the client's stream completes as if nothing happened.

Two real engine processes (the real model, float32, greedy), real Redis, the
gateway's pipeline in the test's loop, the stub router (its log of picks and
of the failures the gateway reports is what the test reads). Each test kills
the replica serving its request at a chosen moment (during prefill, mid-stream,
inside a grammar-constrained JSON answer, inside a forced tool call) and
compares what the client got with what the same request gives alone; a killed
replica is started again before the next test.
"""

import asyncio
import dataclasses
import json
import uuid
from dataclasses import dataclass

import jsonschema
import pytest

from maas.v1 import (
    common_pb2,
    engine_pb2,
    engine_pb2_grpc,
    router_pb2_grpc,
    tokenizer_pb2,
    tokenizer_pb2_grpc,
)
from maas_services.common.grpc_client import open_channel
from maas_services.common.model_files import ModelNotFoundError, default_model_path
from maas_services.common.openai_api.delta import Delta
from maas_services.common.openai_api.openai_format import ResponseShape
from maas_services.common.openai_api.parsed_request import TextPrompt, chat_request
from maas_services.common.openai_api.schemas import ChatCompletionRequest
from maas_services.common.redis_client import open_redis
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.gateway.admission.tenants import Principal, Tenant
from maas_services.gateway.pipeline import Pipeline
from maas_services.gateway.routing.routes_watcher import RoutesWatcher
from maas_services.gateway.server import build_pipeline
from maas_services.gateway.settings import GatewaySettings
from maas_services.gateway.upstream.upstreams import Upstreams
from tests.engine_replica import EngineReplica
from tests.integration.gateway.conftest import MODEL, parsed
from tests.integration.gateway.stubs import StubRouter, StubTokenizer, start
from tests.integration.gateway.test_prefill_billing import billed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CHUNK = 16  # prefill tokens a step: a long prompt takes many steps
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "people": {"type": "integer"}},
    "required": ["city", "people"],
    "additionalProperties": False,
}
WEATHER = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}


def killable(name: str, log_dir) -> EngineReplica:
    """One engine process on fixed ports, which a test may kill and the next restart."""
    return EngineReplica(
        name,
        log_dir,
        {
            "model-id": MODEL,
            "dtype": "float32",
            "max-num-seqs": 4,
            "max-model-len": 1024,
            "max-num-batched-tokens": CHUNK,
            "kv-cache-memory": 32_000_000,
            "torch-threads": 1,
        },
    )


@pytest.fixture(scope="module")
def tokenizer():
    try:
        return load_tokenizer(default_model_path())
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("replicas")
    started = [killable(f"r{i}", log_dir) for i in range(2)]

    async def start_all():
        await asyncio.gather(*(r.start(timeout=300) for r in started))

    asyncio.run(start_all())
    yield started
    for replica in started:
        replica.process.stop(timeout=30)


class GrammarTokenizer(StubTokenizer):
    """The stub tokenizer, passing every grammar: the engines compile it for real."""

    async def ValidateGrammar(self, request, context):
        return tokenizer_pb2.ValidateGrammarResponse()


@dataclass
class Gateway:
    pipeline: Pipeline
    router: StubRouter
    redis_url: str


@pytest.fixture
async def gateway(replicas, redis_url, tmp_path):
    """The gateway's pipeline over both replicas, each alive (a killed one started again)."""
    await asyncio.gather(*(r.start(timeout=300) for r in replicas if not r.alive))
    router = StubRouter([(r.name, r.address, MODEL) for r in replicas])
    router_server, router_address = await start(
        router, router_pb2_grpc.add_RouterServicer_to_server
    )
    tokenizer_server, tokenizer_address = await start(
        GrammarTokenizer(max_model_len=1024), tokenizer_pb2_grpc.add_TokenizerServicer_to_server
    )
    settings = GatewaySettings(
        redis_url=redis_url,
        router_address=router_address,
        models_cache_seconds=0,
        usage_spool_dir=str(tmp_path / "spool"),
        hold_timeout_seconds=1.0,
    )
    redis = open_redis(redis_url)
    upstreams = Upstreams(tokenizer_address, router_address)
    (tmp_path / "routes.yaml").write_text("")
    pipeline = build_pipeline(
        settings, upstreams, redis, RoutesWatcher(str(tmp_path / "routes.yaml"))
    )
    yield Gateway(pipeline, router, redis_url)
    await pipeline.background.wait()
    await upstreams.close()
    await router_server.stop(0)
    await tokenizer_server.stop(0)
    await redis.aclose()


def chat(tokenizer, text: str) -> list[int]:
    return tokenizer.encode_chat([{"role": "user", "content": text}])


@dataclass
class Answer:
    deltas: list[Delta]
    event: object  # the request's usage event
    killed: EngineReplica | None

    @property
    def text(self) -> str:
        return "".join(delta.text for delta in self.deltas)

    @property
    def finishes(self) -> list[str]:
        return [delta.finish_reason for delta in self.deltas if delta.finish_reason]


async def answer(gateway: Gateway, request, kill_after=None, replicas=()) -> Answer:
    """One request's deltas, usage event and the replica killed;
    `kill_after(deltas seen)` says when to kill -9 the replica serving it."""
    tenant = Tenant(name=f"kill-{uuid.uuid4().hex[:8]}", tpm=100_000_000)
    run = await gateway.pipeline.admit(Principal(tenant, "key_test"), request)
    deltas, killed = [], None
    async with run:
        async for delta in run.deltas:
            deltas.append(delta)
            if kill_after is not None and killed is None and kill_after(len(deltas)):
                killed = serving(gateway, replicas)
                killed.kill()
    await gateway.pipeline.background.wait()
    event, _, _ = await billed(gateway.redis_url, tenant.name, request.request_id)
    return Answer(deltas, event, killed)


def serving(gateway: Gateway, replicas) -> EngineReplica:
    return next(r for r in replicas if r.name == gateway.router.picks[-1])


def greedy(prompt: list[int], max_tokens: int, **sampling):
    return parsed(prompt=prompt, max_tokens=max_tokens, temperature=0, **sampling)


def same_request(request):
    """The same request again, under a new id."""
    return parsed(
        prompt=request.prompt.text,
        max_tokens=request.sampling.max_tokens,
        **{
            field.name: value
            for field, value in request.sampling.ListFields()
            if field.name != "max_tokens"
        },
    )


async def test_killed_mid_stream_the_stream_completes_as_alone(gateway, replicas, tokenizer):
    request = greedy(chat(tokenizer, "Tell me about rivers."), 40, ignore_eos=True)
    alone = await answer(gateway, request)

    again = same_request(request)
    cut = await answer(gateway, again, kill_after=lambda seen: seen >= 8, replicas=replicas)
    assert cut.killed is not None and not cut.killed.alive
    assert cut.text == alone.text
    assert cut.finishes == ["length"]
    event = cut.event
    assert (event.prompt_tokens, event.completion_tokens) == (len(request.prompt.text), 40)
    assert event.completion_tokens == alone.event.completion_tokens
    assert event.migration_prefill_tokens >= len(request.prompt.text) + 8
    assert gateway.router.releases == [again.request_id]


async def test_killed_before_the_first_token_the_stream_completes_as_alone(
    gateway, replicas, tokenizer
):
    long = "Summarise this. " + " ".join(f"Line {i} of a long report." for i in range(60))
    request = greedy(chat(tokenizer, long), 12, ignore_eos=True)
    alone = await answer(gateway, request)

    again = same_request(request)
    pending = asyncio.create_task(answer(gateway, again))
    # Killed while its prompt is still being computed, chunk by chunk.
    while len(gateway.router.picks) < 2:
        await asyncio.sleep(0.01)
    victim = serving(gateway, replicas)
    await until_running(victim.address)
    victim.kill()
    cut = await pending
    assert cut.text == alone.text
    assert cut.finishes == ["length"]
    assert (cut.event.prompt_tokens, cut.event.completion_tokens) == (
        len(request.prompt.text),
        12,
    )
    assert len(gateway.router.picks) == 3  # alone, then the killed one and its successor


async def test_killed_inside_a_json_answer_the_json_completes_as_alone(
    gateway, replicas, tokenizer
):
    grammar = common_pb2.Grammar(kind=common_pb2.Grammar.KIND_JSON_SCHEMA, text=json.dumps(SCHEMA))
    request = greedy(chat(tokenizer, "Describe Paris in JSON."), 64, grammar=grammar)
    alone = await answer(gateway, request)
    jsonschema.validate(json.loads(alone.text), SCHEMA)

    cut = await answer(
        gateway, same_request(request), kill_after=lambda seen: seen >= 4, replicas=replicas
    )
    assert cut.killed is not None
    assert cut.text == alone.text
    assert cut.finishes == ["stop"]
    assert cut.event.completion_tokens == alone.event.completion_tokens


def forced_call(tokenizer, text: str):
    """A chat request whose tool_choice names get_weather, as the HTTP front parses
    it (the grammar that admits only that call), its prompt in token ids."""
    body = ChatCompletionRequest(
        model=MODEL,
        messages=[{"role": "user", "content": text}],
        tools=[{"type": "function", "function": WEATHER}],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64,
        temperature=0,
    )
    return dataclasses.replace(chat_request(body, None), prompt=TextPrompt(chat(tokenizer, text)))


def streamed_calls(request, deltas: list[Delta]) -> tuple[list[dict], str | None]:
    """The tool calls and the finish a client streaming these deltas is sent."""
    shape = ResponseShape(request.request_id, MODEL, chat=True, tool_mode=request.tool_mode)
    calls, finish = [], None
    for delta in deltas:
        choice = shape.chunk_choice(delta)
        calls += choice["delta"].get("tool_calls", [])
        finish = choice["finish_reason"] or finish
    return calls, finish


async def test_killed_inside_a_tool_call_the_call_completes_as_alone(gateway, replicas, tokenizer):
    request = forced_call(tokenizer, "What will the weather be in Lyon this week?")
    alone = await answer(gateway, request)
    alone_calls, alone_finish = streamed_calls(request, alone.deltas)
    assert [call["function"]["name"] for call in alone_calls] == ["get_weather"]
    arguments = "".join(call["function"]["arguments"] for call in alone_calls)
    jsonschema.validate(json.loads(arguments), WEATHER["parameters"])
    assert alone_finish == "tool_calls"

    again = dataclasses.replace(request, request_id=f"again-{uuid.uuid4().hex}")
    cut = await answer(gateway, again, kill_after=lambda seen: seen >= 4, replicas=replicas)
    calls, finish = streamed_calls(again, cut.deltas)
    assert cut.killed is not None and not cut.killed.alive
    assert len(cut.deltas) > 4  # the kill came while the call was still being written
    assert [call["function"]["name"] for call in calls] == ["get_weather"]
    assert "".join(call["function"]["arguments"] for call in calls) == arguments
    assert finish == "tool_calls"
    assert cut.event.completion_tokens == alone.event.completion_tokens
    assert cut.event.migration_prefill_tokens > 0


async def test_the_last_replica_killed_ends_with_an_error_billed_as_cut_short(
    gateway, replicas, tokenizer
):
    only = replicas[0]
    gateway.router.endpoints[:] = [(only.name, only.address, MODEL)]
    request = greedy(chat(tokenizer, "Tell me about mountains."), 40, ignore_eos=True)
    cut = await answer(gateway, request, kill_after=lambda seen: seen >= 6, replicas=replicas)
    event = cut.event
    assert cut.killed is only
    assert cut.finishes == ["error"]
    # The prompt it caused and the tokens delivered before the kill: no more, no less.
    assert event.prompt_tokens == len(request.prompt.text)
    assert 6 <= event.completion_tokens < 40
    assert event.finish_reason == "error"
    assert event.migration_prefill_tokens == 0


async def until_running(address: str) -> None:
    async with open_channel(address, "test") as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        while (await stub.GetLoad(engine_pb2.GetLoadRequest())).running == 0:
            await asyncio.sleep(0.01)
