"""A request that makes a step raise fails alone; its batchmates go on unharmed.

The poisons are what validation would have to miss: a field changed after
admission (the engine holds the caller's SamplingParams), a token id outside
the vocabulary slipped into a prompt. The engine's code is not patched: the
step raises where it really would, in the sampler or in the model's forward.
"""

import pytest

from maas_services.engine.sampling_params import SamplingParams
from tests.integration.engine.test_llm_engine import greedy, make_engine, run, tokens

pytestmark = pytest.mark.slow

VICTIM = [1, 9690, 198, 19556, 451, 253, 1345, 30, 2, 198, 520, 9531, 198]
POISON = [1, 4093, 314, 253, 2365, 30]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def alone(model, tokenizer) -> list[int]:
    got = run(make_engine(model, tokenizer), {"victim": (VICTIM, greedy(NEW_TOKENS))})
    return tokens(got[("victim", 0)])


def poison_sampling(engine) -> None:
    # min_tokens bans the stop ids by indexing the logits with them.
    params = engine.requests["poison"].params
    params.min_tokens, params.stop_token_ids = 1, [engine.model_config.vocab_size + 7]


def poison_forward(engine) -> None:
    engine.requests["poison"].seqs[0].token_ids[-1] = engine.model_config.vocab_size + 7


@pytest.mark.parametrize("poison", [poison_sampling, poison_forward])
@pytest.mark.parametrize("poison_n", [1, 3])
def test_the_poisoned_request_fails_alone(model, tokenizer, alone, poison, poison_n):
    engine = make_engine(model, tokenizer)
    engine.add_request("victim", VICTIM, greedy(NEW_TOKENS))
    engine.add_request("poison", POISON, greedy(NEW_TOKENS, n=poison_n))
    poison(engine)
    got = run(engine, {})
    victim = got[("victim", 0)]
    assert victim[-1].finish_reason == "length"
    assert tokens(victim) == alone
    (failed,) = got[("poison", 0)]
    assert failed.finish_reason == "error" and failed.error
    assert ("poison", 1) not in got
    # What the poison left in the cache harms no later request either.
    again = run(engine, {"again": (VICTIM, greedy(NEW_TOKENS))})[("again", 0)]
    assert tokens(again) == alone


def test_a_step_that_fails_for_every_request_fails_them_all(model, tokenizer):
    engine = make_engine(model, tokenizer)
    for name in ("a", "b"):
        engine.add_request(name, POISON, greedy(NEW_TOKENS))
        engine.requests[name].seqs[0].token_ids[-1] = engine.model_config.vocab_size + 7
    # Nothing to pin on one request: the caller fails everything (INTERNAL).
    with pytest.raises(IndexError):
        engine.step()


def test_the_largest_seed_with_several_samples_runs_beside_a_victim(model, tokenizer, alone):
    sampled = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, seed=2**64 - 1, n=2)
    got = run(
        make_engine(model, tokenizer),
        {"victim": (VICTIM, greedy(NEW_TOKENS)), "seeded": (POISON, sampled)},
    )
    assert tokens(got[("victim", 0)]) == alone
    assert [got[("seeded", i)][-1].finish_reason for i in range(2)] == ["length", "length"]
