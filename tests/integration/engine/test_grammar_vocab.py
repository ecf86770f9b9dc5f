"""The tokenizer service's grammar check and the engine compile against one vocabulary.

Both build xgrammar's TokenizerInfo through services/common/grammar/vocab.py,
so a grammar the check accepts is the grammar the engine compiles.
"""

import pytest

from maas_services.common.grammar.worker import WorkerLimits
from maas_services.tokenizer.grammar_check import GrammarChecker
from tests.integration.engine.test_llm_engine import make_engine

pytestmark = pytest.mark.slow


def test_the_check_and_the_engine_see_the_same_vocabulary(model, tokenizer):
    _, config = model
    engine_info = make_engine(model, tokenizer).grammar_compiler().info
    checker = GrammarChecker(tokenizer)
    checker.prepare(WorkerLimits(), cache_bytes=0, tenant_cache_bytes=0)
    check_info = checker.compiler.info
    assert engine_info.vocab_size == check_info.vocab_size == config.vocab_size
    assert engine_info.stop_token_ids == check_info.stop_token_ids == [tokenizer.eos_token_id]
    assert set(engine_info.stop_token_ids) <= set(config.eos_token_ids)
    assert engine_info.decoded_vocab == check_info.decoded_vocab
