"""One tenant's grammars cannot take the tokenizer from another, over real gRPC on loopback.

The cost caps refuse the issue's attack grammar; a compile past the deadline
is refused and the next one compiles; a tenant gets one compile in flight
and a CPU-seconds budget, while another tenant is served; the gateway turns
those refusals into 429s with Retry-After.
"""

import asyncio

import grpc
import pytest

from maas.v1 import common_pb2, tokenizer_pb2, tokenizer_pb2_grpc
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_services.common.openai_api.errors import APIError
from maas_services.gateway.upstream.prompt_encoder import PromptEncoder
from maas_services.tokenizer.server import start_tokenizer
from maas_services.tokenizer.settings import TokenizerSettings
from tests.integration.tokenizer.test_tokenizer_limits import refused

Kind = common_pb2.Grammar
ATTACK = "root ::= " + " ".join(f"r{i}" for i in range(10)) + "\n"
ATTACK += "\n".join(f'r{i} ::= [^"\\nab]{{4,128}}' for i in range(10))


def slow(excluded: str = "ab") -> common_pb2.Grammar:
    """Under the caps, and seconds of compile CPU on SmolLM2's vocabulary."""
    return common_pb2.Grammar(kind=Kind.KIND_EBNF, text=f'root ::= [^"\\n{excluded}]{{0,128}}')


def quick(text: str = "[a-z]+@example\\.com") -> common_pb2.Grammar:
    return common_pb2.Grammar(kind=Kind.KIND_REGEX, text=text)


@pytest.fixture
async def serve(tokenizer):
    """serve(**settings) -> a stub of a started tokenizer service, stopped after the test."""
    started = []

    async def start(**overrides):
        settings = TokenizerSettings(model_id=DEFAULT_MODEL_ID, **overrides)
        handle, pool = await start_tokenizer(settings, tokenizer)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{handle.port}")
        started.append((handle, pool, channel))
        stub = tokenizer_pb2_grpc.TokenizerStub(channel)
        await validate(stub, quick(), "warm-up")  # the vocabulary pass and the worker's start
        return stub

    yield start
    for handle, pool, channel in started:
        await channel.close()
        await handle.server.stop(0)
        pool.shutdown()


def validate(stub, grammar: common_pb2.Grammar, tenant: str):
    return stub.ValidateGrammar(
        tokenizer_pb2.ValidateGrammarRequest(grammar=grammar, tenant=tenant)
    )


async def test_the_issues_attack_grammar_is_refused_by_the_caps(serve):
    stub = await serve()
    error = await refused(validate(stub, common_pb2.Grammar(kind=Kind.KIND_EBNF, text=ATTACK), "a"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "repetition bounds (the n of every {m,n}) add up to 1280" in error.details()
    assert "at most 256" in error.details()


async def test_a_compile_past_the_deadline_is_refused_and_the_next_compiles(serve):
    stub = await serve(grammar_timeout_s=1)
    error = await refused(validate(stub, slow(), "a"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "did not compile within 1 s" in error.details()
    answer = await validate(stub, quick("x[0-9]+"), "a")
    assert answer.compile_seconds > 0


async def test_a_tenants_second_compile_is_refused_while_another_tenant_is_served(serve):
    stub = await serve(grammar_timeout_s=300)
    first, second, other = await asyncio.gather(
        validate(stub, slow("cd"), "a"),
        validate(stub, slow("ef"), "a"),
        validate(stub, quick("[0-9]{3}-[0-9]{4}"), "b"),
        return_exceptions=True,
    )
    outcomes = [first, second]
    errors = [o for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
    assert len(errors) == 1, outcomes
    assert errors[0].code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "already has a grammar compile in flight" in errors[0].details()
    assert dict(errors[0].trailing_metadata())["retry-after"] == "1"
    assert isinstance(other, tokenizer_pb2.ValidateGrammarResponse)


async def test_a_tenant_past_its_compile_budget_is_refused_and_its_cache_still_answers(serve):
    # Below any compile's CPU time: a fast CPU compiles these in under a millisecond.
    stub = await serve(grammar_budget_s_per_minute=1e-6)
    charged = await validate(stub, quick("[a-f]{4}"), "a")
    assert charged.compile_seconds > 0
    error = await refused(validate(stub, quick("[g-k]{4}"), "a"))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "compile budget" in error.details()
    # Its own grammar, already compiled: no compile, no charge.
    assert (await validate(stub, quick("[a-f]{4}"), "a")).compile_seconds == 0
    await validate(stub, quick("[g-k]{4}"), "b")  # another tenant's budget is its own


async def test_the_gateway_answers_a_refused_compile_with_429_and_retry_after(serve):
    stub = await serve(grammar_budget_s_per_minute=1e-6)
    encoder = PromptEncoder(stub)
    await encoder.check_grammar("", quick("[a-f]{5}"), "response_format", "a")
    with pytest.raises(APIError) as caught:
        await encoder.check_grammar("", quick("[g-k]{5}"), "response_format", "a")
    error = caught.value
    assert (error.status, error.code, error.param) == (
        429,
        "rate_limit_exceeded",
        "response_format",
    )
    assert int(error.headers["Retry-After"]) >= 1
    with pytest.raises(APIError) as caught:
        await encoder.check_grammar(
            "", common_pb2.Grammar(kind=Kind.KIND_EBNF, text=ATTACK), "x", "b"
        )
    assert caught.value.status == 400 and "at most" in caught.value.message
