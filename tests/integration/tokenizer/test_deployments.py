"""One tokenizer service, two deployments with different tokenizers, over real gRPC on loopback."""

import asyncio

import grpc
import pytest
from prometheus_client import REGISTRY

from maas.v1 import common_pb2, tokenizer_pb2, tokenizer_pb2_grpc
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.tokenizer.registry import (
    Deployment,
    DeploymentLoadError,
    TokenizerRegistry,
    UnknownDeploymentError,
)
from maas_services.tokenizer.server import start_tokenizer
from maas_services.tokenizer.settings import TokenizerSettings, TokenizerSource
from tests.integration.tokenizer.test_tokenizer_limits import refused
from tests.integration.tokenizer.toy_model import MAX_MODEL_LEN

SMOL, TOY = "smol", "toy"
CHAT = [tokenizer_pb2.ChatMessage(role="user", content="Hello there, how are you?")]


@pytest.fixture(scope="module")
def toy(toy_model):
    return load_tokenizer(toy_model)


@pytest.fixture
async def stub(tokenizer, toy_model):
    """SmolLM2 (the GGUF) as the default deployment, the toy folder as `toy`."""
    settings = TokenizerSettings(
        model_id=SMOL,
        tokenizer_models={TOY: TokenizerSource(path=str(toy_model))},
        # Less than the compiler's first build (xgrammar, torch, the vocabulary: tens
        # of seconds on a loaded machine), far more than two words' grammar takes.
        grammar_timeout_s=5,
    )
    handle, pool = await start_tokenizer(settings, tokenizer)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{handle.port}") as channel:
        yield tokenizer_pb2_grpc.TokenizerStub(channel)
    await handle.server.stop(0)
    pool.shutdown()


async def test_each_deployment_renders_and_encodes_with_its_own_tokenizer(stub, tokenizer, toy):
    messages = [{"role": m.role, "content": m.content} for m in CHAT]
    answers = {}
    for model, own in ((SMOL, tokenizer), (TOY, toy), ("", tokenizer)):
        chat = await stub.RenderChat(
            tokenizer_pb2.RenderChatRequest(model=model, messages=CHAT, add_generation_prompt=True)
        )
        text = await stub.Encode(tokenizer_pb2.EncodeRequest(model=model, text="Hello there"))
        assert list(chat.token_ids) == own.encode_chat(messages)
        assert list(text.token_ids) == own.encode("Hello there")
        answers[model] = chat
    assert answers[SMOL].prompt.startswith("<|im_start|>system\n")
    assert answers[TOY].prompt == "<s>[INST] Hello there, how are you? [/INST]"
    assert answers[""] == answers[SMOL]  # no deployment named: the default
    assert answers[SMOL].max_model_len == 8192
    assert answers[TOY].max_model_len == MAX_MODEL_LEN


async def test_lengths_vocabulary_and_decoding_are_the_deployments(stub, toy):
    long_text = "Hello there " * 40  # ~80 tokens: over the toy's 64, far under SmolLM2's 8192
    counted = await stub.Count(tokenizer_pb2.EncodeRequest(model=TOY, text=long_text))
    assert counted.count > MAX_MODEL_LEN and counted.max_model_len == MAX_MODEL_LEN
    assert (await stub.Encode(tokenizer_pb2.EncodeRequest(model=SMOL, text=long_text))).token_ids
    error = await refused(stub.Encode(tokenizer_pb2.EncodeRequest(model=TOY, text=long_text)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in error.details()

    beyond_toy = [toy.vocab_size + 10]
    ok = await stub.Encode(tokenizer_pb2.EncodeRequest(model=SMOL, token_ids=beyond_toy))
    assert list(ok.token_ids) == beyond_toy
    error = await refused(stub.Encode(tokenizer_pb2.EncodeRequest(model=TOY, token_ids=beyond_toy)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT

    ids = toy.encode("Hello there")
    decoded = await stub.Decode(tokenizer_pb2.DecodeRequest(model=TOY, token_ids=ids))
    assert decoded.text == "Hello there"


async def test_grammar_is_checked_against_the_deployments_vocabulary(stub):
    grammar = common_pb2.Grammar(kind=common_pb2.Grammar.KIND_CHOICE, text='["yes", "no"]')
    await stub.ValidateGrammar(tokenizer_pb2.ValidateGrammarRequest(model=TOY, grammar=grammar))


async def test_an_unknown_deployment_is_not_found_on_every_call(stub):
    calls = [
        stub.RenderChat(tokenizer_pb2.RenderChatRequest(model="nope", messages=CHAT)),
        stub.Encode(tokenizer_pb2.EncodeRequest(model="nope", text="hi")),
        stub.Count(tokenizer_pb2.EncodeRequest(model="nope", text="hi")),
        stub.Decode(tokenizer_pb2.DecodeRequest(model="nope", token_ids=[1])),
        stub.ValidateGrammar(tokenizer_pb2.ValidateGrammarRequest(model="nope")),
    ]
    for call in calls:
        error = await refused(call)
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert "'nope'" in error.details() and "'smol', 'toy'" in error.details()


class CountingLoader:
    def __init__(self):
        self.loads: list[str] = []

    def __call__(self, path):
        self.loads.append(path.name)
        return load_tokenizer(path)


def registry(tokenizer, sources: dict[str, str], max_resident: int = 4):
    load = CountingLoader()
    default = Deployment.of(SMOL, tokenizer, 8192)
    sources = {name: TokenizerSource(path=path) for name, path in sources.items()}
    return TokenizerRegistry(default, sources, max_resident, load), load


async def test_concurrent_first_requests_share_one_load(tokenizer, toy_model):
    tokenizers, load = registry(tokenizer, {"shared": str(toy_model)})
    loads = {"deployment": "shared", "outcome": "loaded"}
    before = REGISTRY.get_sample_value("maas_tokenizer_loads_total", loads) or 0
    # Every get is running before the load finishes: it needs a thread, and so the loop.
    first = await asyncio.gather(*(tokenizers.get("shared") for _ in range(8)))
    assert load.loads == [toy_model.name]
    assert REGISTRY.get_sample_value("maas_tokenizer_loads_total", loads) == before + 1
    assert all(d is first[0] for d in first) and first[0].max_model_len == MAX_MODEL_LEN
    assert await tokenizers.get("shared") is first[0]
    assert load.loads == [toy_model.name]


async def test_a_caller_that_goes_away_does_not_cancel_the_load(tokenizer, toy_model):
    tokenizers, load = registry(tokenizer, {TOY: str(toy_model)})
    gone = asyncio.ensure_future(tokenizers.get(TOY))
    waiting = asyncio.ensure_future(tokenizers.get(TOY))
    await asyncio.sleep(0)
    gone.cancel()
    assert (await waiting).name == TOY
    assert load.loads == [toy_model.name]


async def test_the_least_recently_used_goes_past_the_bound(tokenizer, toy_model, tmp_path):
    other = tmp_path / "other"
    other.symlink_to(toy_model, target_is_directory=True)
    tokenizers, load = registry(tokenizer, {TOY: str(toy_model), "other": str(other)}, 1)
    await tokenizers.get(TOY)
    await tokenizers.get("other")
    await tokenizers.get(TOY)
    assert load.loads == [toy_model.name, "other", toy_model.name]
    assert (await tokenizers.get("")).tokenizer is tokenizer  # the default is never evicted
    with pytest.raises(UnknownDeploymentError):
        await tokenizers.get("nope")


async def test_a_failed_load_is_tried_again(tokenizer, toy_model, tmp_path):
    late = tmp_path / "late"
    tokenizers, load = registry(tokenizer, {"late": str(late)})
    with pytest.raises(DeploymentLoadError, match="'late' could not be loaded"):
        await tokenizers.get("late")
    late.symlink_to(toy_model, target_is_directory=True)  # the volume mounted
    assert (await tokenizers.get("late")).name == "late"
    assert load.loads == ["late", "late"]


def test_a_deployment_is_ready_to_encode_on_the_loop_once_built(toy_model):
    # Small chats are encoded on the event loop: their first must not build the
    # plain-text encoder (a copy of the vocabulary) there.
    deployment = Deployment.of(TOY, load_tokenizer(toy_model), 0)
    assert {"special_tokens", "plain_text_tokenizer"} <= vars(deployment.tokenizer).keys()
