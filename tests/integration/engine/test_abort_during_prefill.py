"""An abort during a chunked prefill reports how much of the prompt the engine computed.

The gateway bills those tokens when a client leaves before its first token
(tests/integration/gateway/test_prefill_billing.py); this checks the number
against the engine's own schedule on the real model.
"""

import asyncio

import pytest

from tests.integration.engine.core_thread import core_on_thread
from tests.integration.engine.test_llm_engine import greedy, make_engine

pytestmark = pytest.mark.slow

CHUNK = 32
# Forty steps of prefill: an abort sent during it lands long before the end.
PROMPT = list(range(1000, 1000 + 40 * CHUNK + 5))


def prefill_steps(engine, steps: int) -> None:
    for _ in range(steps):
        assert engine.step() == []  # no token yet: still in prefill


def test_abort_reports_the_chunks_computed(model, tokenizer):
    engine = make_engine(model, tokenizer, max_num_batched_tokens=CHUNK)
    engine.add_request("a", PROMPT, greedy())
    prefill_steps(engine, 3)
    (out,) = engine.abort("a")
    assert (out.finish_reason, out.completion_tokens) == ("abort", 0)
    assert out.prompt_tokens == len(PROMPT)
    assert (out.computed_prompt_tokens, out.cached_prompt_tokens) == (3 * CHUNK, 0)


def test_cache_hits_count_as_computed(model, tokenizer):
    engine = make_engine(model, tokenizer, max_num_batched_tokens=CHUNK)
    engine.add_request("warm", PROMPT[: 4 * CHUNK], greedy(max_tokens=1))
    while engine.has_work:
        engine.step()
    engine.add_request("b", PROMPT, greedy())
    prefill_steps(engine, 1)
    (out,) = engine.abort("b")
    # Four chunks from the cache (whole blocks), then one computed.
    assert out.cached_prompt_tokens == 4 * CHUNK
    assert out.computed_prompt_tokens == 5 * CHUNK


async def test_aborting_n_samples_in_prefill_ends_the_stream(model, tokenizer):
    async with core_on_thread(
        make_engine(model, tokenizer, max_num_batched_tokens=CHUNK)
    ) as engine:
        stream = engine.generate("n2", PROMPT, greedy(n=2))
        pending = asyncio.ensure_future(anext(stream))
        # The load the core reports after each step: the prompt is in prefill.
        while not engine.load.running:
            await asyncio.sleep(0.01)
        assert engine.abort("n2")
        out = await pending
        assert out.finish_reason == "abort" and 0 < out.computed_prompt_tokens < len(PROMPT)
        # One abort ends both samples, though the second was never forked.
        # Bounded only so that a stream left open fails instead of hanging.
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(stream), 60)
