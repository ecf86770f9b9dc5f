"""The engine core computes a wide step on every thread and a narrow one on one fewer.

Seen from inside the real model's forward (a forward pre-hook on the step's
thread), with greedy answers still transformers' token for token.
"""

import asyncio

import pytest
import torch

from maas_services.engine.core.compute_threads import ComputeThreads
from tests.integration.engine.core_thread import core_on_thread
from tests.integration.engine.test_llm_engine import QUESTIONS, greedy, make_engine

pytestmark = pytest.mark.slow

WIDE_ROWS = 8
NEW_TOKENS = 6


async def test_prefill_runs_on_two_threads_and_decodes_of_few_rows_on_one(
    model, tokenizer, hf_greedy
):
    llama, _ = model
    prompts = [tokenizer.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS[:2]]
    assert min(map(len, prompts)) >= WIDE_ROWS > len(prompts), "prefills wide, decodes narrow"
    seen: list[tuple[int, int]] = []  # (rows, threads) of every forward

    def record(module, args):
        seen.append((len(args[0]), torch.get_num_threads()))

    engine = make_engine(model, tokenizer)
    before = torch.get_num_threads()
    hook = llama.register_forward_pre_hook(record)
    try:
        async with core_on_thread(engine, ComputeThreads(2, WIDE_ROWS)) as core:

            async def answer(i: int, prompt: list[int]) -> list[int]:
                stream = core.generate(f"r{i}", prompt, greedy(NEW_TOKENS))
                return [token async for out in stream for token in out.token_ids]

            got = await asyncio.gather(*(answer(i, p) for i, p in enumerate(prompts)))
    finally:
        hook.remove()
        torch.set_num_threads(before)  # MKL's count is process-wide
    assert got == [hf_greedy(p, NEW_TOKENS) for p in prompts]
    assert {threads for rows, threads in seen if rows >= WIDE_ROWS} == {2}
    assert {threads for rows, threads in seen if rows < WIDE_ROWS} == {1}
