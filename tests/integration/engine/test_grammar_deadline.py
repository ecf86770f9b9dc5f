"""The engine never compiles without a deadline: a compile past it fails only its request.

The core compiles in the engine's grammar worker (services/common/grammar/worker.py);
here its deadline is short enough that a grammar within the caps misses it.
"""

import pytest

from maas_services.common.grammar.compiler import GrammarCompiler
from maas_services.common.grammar.vocab import tokenizer_info
from maas_services.common.grammar.worker import WorkerLimits
from maas_services.engine.async_engine import RequestFailed
from tests.integration.engine.core_thread import core_on_thread
from tests.integration.engine.test_grammar_compile_off_step import (
    collect,
    constrained,
    free,
    guarded,
    prompt,
)
from tests.integration.engine.test_llm_engine import make_engine

pytestmark = pytest.mark.slow

# Within the caps, and more than a second of compile CPU on this vocabulary.
SLOW = 'root ::= [^"\\nab]{0,128}'


async def test_a_compile_past_the_deadline_fails_only_its_request(model, tokenizer):
    engine = make_engine(model, tokenizer)
    compiler = GrammarCompiler(tokenizer_info(tokenizer), WorkerLimits(deadline_s=1))
    engine.grammar_compiler = lambda: compiler  # the core binds it when it starts
    async with core_on_thread(engine) as client:
        running = client.generate("free", prompt(tokenizer, "Tell a story."), free(12))
        first = await guarded(anext(running))
        slow = client.generate("slow", prompt(tokenizer, "Hi."), constrained("ebnf", SLOW))
        with pytest.raises(RequestFailed, match="grammar: the grammar did not compile within 1 s"):
            await guarded(anext(slow))
        rest = await guarded(collect(running))
        assert rest[-1].finish_reason == "length"
        assert len(first.token_ids) + sum(len(out.token_ids) for out in rest) == 12
        # The worker was replaced: the next grammar compiles and constrains its request.
        choice = await guarded(
            collect(
                client.generate(
                    "next", prompt(tokenizer, "Yes or no?"), constrained("choice", '["yes", "no"]')
                )
            )
        )
        assert "".join(out.text for out in choice) in ("yes", "no")
    assert not engine.requests
    compiler.worker.close()
