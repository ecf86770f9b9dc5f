"""A grammar compiles off the core's step thread (services/engine/core/grammar_compiles.py).

The compile is held on a gate the test opens: what the running request does
meanwhile shows where the compile ran. On the old code the core thread
itself waited at the gate, and the running request got no token until it
opened (the guard below turns that hang into a failure).
"""

import asyncio
import json
import threading

import pytest

from maas_services.common.grammar.spec import GrammarSpec
from maas_services.engine.async_engine import RequestFailed
from maas_services.engine.sampling_params import SamplingParams
from tests.integration.engine.core_thread import core_on_thread
from tests.integration.engine.test_llm_engine import make_engine

pytestmark = pytest.mark.slow

# Not a speed limit: how long a broken build may hang before the test says so.
HANG_GUARD_S = 120
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


class HeldCompile:
    """Stands for the engine's grammar compiler: each compile waits until the gate opens."""

    def __init__(self, engine):
        self._compiler = engine.grammar_compiler
        self.started = threading.Event()
        self.returned = threading.Event()
        self.gate = threading.Event()

    def __call__(self):
        return self

    def compile(self, spec, tenant=""):
        self.started.set()
        self.gate.wait()
        try:
            return self._compiler().compile(spec, tenant)
        finally:
            self.returned.set()


@pytest.fixture
def held(model, tokenizer):
    engine = make_engine(model, tokenizer)
    hold = HeldCompile(engine)
    engine.grammar_compiler = hold  # the core binds it when it starts
    try:
        yield engine, hold
    finally:
        hold.gate.set()


def guarded(awaitable):
    return asyncio.wait_for(awaitable, HANG_GUARD_S)


def prompt(tokenizer, text: str) -> list[int]:
    return tokenizer.encode_chat([{"role": "user", "content": text}])


def free(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def constrained(kind: str, text: str) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=32, grammar=GrammarSpec(kind, text))


async def collect(stream) -> list:
    return [out async for out in stream]


async def start_running(client, tokenizer, max_tokens: int = 24):
    stream = client.generate("free", prompt(tokenizer, "Tell a story."), free(max_tokens))
    await guarded(anext(stream))
    return stream


async def test_running_requests_keep_stepping_while_a_grammar_compiles(held, tokenizer):
    engine, hold = held
    async with core_on_thread(engine) as client:
        running = await start_running(client, tokenizer)
        json_request = asyncio.ensure_future(
            collect(
                client.generate(
                    "json",
                    prompt(tokenizer, "Answer yes."),
                    constrained("json_schema", json.dumps(SCHEMA)),
                )
            )
        )
        await guarded(asyncio.to_thread(hold.started.wait))
        # Steps the running request got while the new request's compile was held.
        during = [await guarded(anext(running)) for _ in range(3)]
        assert all(out.token_ids for out in during) and not json_request.done()
        hold.gate.set()
        outputs = await guarded(json_request)
        assert json.loads("".join(out.text for out in outputs))["ok"] in (True, False)
        assert outputs[-1].finish_reason == "stop"
        rest = await guarded(collect(running))
        assert rest[-1].finish_reason == "length"


async def test_an_abort_during_the_compile_leaves_nothing_behind(held, tokenizer):
    engine, hold = held
    async with core_on_thread(engine) as client:
        stream = client.generate(
            "json", prompt(tokenizer, "Answer."), constrained("json_schema", json.dumps(SCHEMA))
        )
        first = asyncio.ensure_future(anext(stream))
        await guarded(asyncio.to_thread(hold.started.wait))
        assert client.abort("json")
        out = await guarded(first)
        assert (out.finish_reason, out.token_ids, out.completion_tokens) == ("abort", [], 0)
        hold.gate.set()
        await guarded(asyncio.to_thread(hold.returned.wait))
        # Steps after the compile returned: the dropped request is not added by any of them.
        after = await guarded(collect(client.generate("after", prompt(tokenizer, "Hi."), free(4))))
        assert after[-1].finish_reason == "length"
    assert not engine.requests and not engine.has_work


async def test_a_compile_error_refuses_only_that_request(held, tokenizer):
    engine, hold = held
    async with core_on_thread(engine) as client:
        running = await start_running(client, tokenizer, max_tokens=12)
        # Passes the cheap checks (a non-empty regex), fails in the compiler.
        bad = client.generate("bad", prompt(tokenizer, "Hi."), constrained("regex", "(unclosed"))
        refused = asyncio.ensure_future(anext(bad))
        await guarded(asyncio.to_thread(hold.started.wait))
        assert (await guarded(anext(running))).token_ids
        hold.gate.set()
        with pytest.raises(RequestFailed, match="grammar: invalid regex"):
            await guarded(refused)
        rest = await guarded(collect(running))
        assert rest[-1].finish_reason == "length"
        assert sum(len(out.token_ids) for out in rest) == 12 - 2
    assert not engine.requests
