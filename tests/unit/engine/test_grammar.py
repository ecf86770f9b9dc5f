"""The grammar package on a tiny vocabulary: batch masks and speculative drafts."""

import pytest
import torch
import xgrammar

from maas_services.common.grammar.compiler import GrammarCompiler
from maas_services.common.grammar.spec import GrammarSpec
from maas_services.engine.grammar.bitmask import apply_grammars
from maas_services.engine.grammar.draft import constrain_draft
from maas_services.engine.grammar.matcher import GrammarState

# Id 0 is the end of sequence (empty: never text).
VOCAB = ["", "a", "b", "c", "ab", "-", "x"]
ID = {text: i for i, text in enumerate(VOCAB)}


@pytest.fixture(scope="module")
def compiler():
    info = xgrammar.TokenizerInfo(VOCAB, stop_token_ids=[0])
    return GrammarCompiler(info)


def allowed(logits_row: torch.Tensor) -> set[str]:
    return {VOCAB[i] for i in torch.nonzero(logits_row > float("-inf")).flatten().tolist()}


def test_only_constrained_rows_are_masked(compiler):
    state = GrammarState(compiler.compile(GrammarSpec("regex", "ab-c")))
    logits = torch.zeros(2, len(VOCAB))
    masked = apply_grammars(logits, [None, state])
    assert torch.equal(masked[0], logits[0])
    assert allowed(masked[1]) == {"a", "ab"}
    assert torch.equal(logits, torch.zeros(2, len(VOCAB)))  # the caller's logits untouched


def test_a_draft_is_cut_before_the_first_forbidden_token_and_the_matcher_rolled_back(compiler):
    state = GrammarState(compiler.compile(GrammarSpec("regex", "ab-c")))
    draft = [ID["a"], ID["b"], ID["c"], ID["-"]]
    kept, masked = constrain_draft(state, draft, torch.zeros(len(draft) + 1, len(VOCAB)))
    assert kept == [ID["a"], ID["b"]]
    assert [allowed(row) for row in masked] == [{"a", "ab"}, {"b"}, {"-"}]
    # Rolled back: the matcher still expects the first token.
    assert allowed(apply_grammars(torch.zeros(1, len(VOCAB)), [state])[0]) == {"a", "ab"}
    for token in [ID["ab"], ID["-"], ID["c"], 0]:
        assert state.accept(token)
    assert state.terminated
