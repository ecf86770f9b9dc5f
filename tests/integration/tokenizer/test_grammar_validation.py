"""The tokenizer service refuses unusable grammars, over real gRPC on loopback."""

import json

import grpc
import pytest

from maas.v1 import common_pb2, tokenizer_pb2, tokenizer_pb2_grpc
from maas_services.common.grammar.spec import MAX_SCHEMA_DEPTH
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_services.tokenizer.server import start_tokenizer
from maas_services.tokenizer.settings import TokenizerSettings
from tests.integration.tokenizer.test_tokenizer_limits import refused

Kind = common_pb2.Grammar


async def serve(tokenizer, timeout_s: float):
    settings = TokenizerSettings(model_id=DEFAULT_MODEL_ID, grammar_timeout_s=timeout_s)
    handle, pool = await start_tokenizer(settings, tokenizer)
    return handle, pool


@pytest.fixture
async def stub(tokenizer):
    handle, pool = await serve(tokenizer, 60)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{handle.port}") as channel:
        yield tokenizer_pb2_grpc.TokenizerStub(channel)
    await handle.server.stop(0)
    pool.shutdown()


def validate(stub, kind, text=""):
    return stub.ValidateGrammar(
        tokenizer_pb2.ValidateGrammarRequest(grammar=common_pb2.Grammar(kind=kind, text=text))
    )


def nested(depth: int) -> str:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return json.dumps(schema)


async def test_grammars_that_compile_pass_and_others_are_named(stub):
    await validate(stub, Kind.KIND_JSON_SCHEMA, nested(3))
    await validate(stub, Kind.KIND_JSON_OBJECT)
    await validate(stub, Kind.KIND_REGEX, "[a-z]+@[a-z]+\\.com")
    await validate(stub, Kind.KIND_CHOICE, '["yes", "no"]')
    await validate(stub, Kind.KIND_EBNF, 'root ::= "a" root | "b"')
    refusals = [
        (Kind.KIND_JSON_SCHEMA, '{"type": "nope"}', 'Unsupported type "nope"'),
        (Kind.KIND_JSON_SCHEMA, nested(MAX_SCHEMA_DEPTH), f"at most {MAX_SCHEMA_DEPTH}"),
        (Kind.KIND_JSON_SCHEMA, "x" * 70_000, "at most 65536"),
        (Kind.KIND_REGEX, "(a", "regex"),
        (Kind.KIND_EBNF, "root ::= nowhere", 'Rule "nowhere" is not defined'),
        (Kind.KIND_UNSPECIFIED, "", "kind is unset"),
    ]
    for kind, text, problem in refusals:
        error = await refused(validate(stub, kind, text))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert problem in error.details(), error.details()


async def test_a_compile_past_the_deadline_is_refused(tokenizer):
    # The first compile also builds the compiler (seconds): far past a microsecond.
    handle, pool = await serve(tokenizer, 1e-6)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{handle.port}") as channel:
        stub = tokenizer_pb2_grpc.TokenizerStub(channel)
        error = await refused(validate(stub, Kind.KIND_JSON_OBJECT))
    await handle.server.stop(0)
    pool.shutdown()
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "did not compile within" in error.details()
