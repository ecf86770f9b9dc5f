import gc
import weakref

import pytest

from services.engine.generator import Generator
from services.engine.sampling_params import SamplingParams

PROMPT = [3, 17, 42, 8]


@pytest.fixture
def generator(tiny_model, tiny_config) -> Generator:
    return Generator(tiny_model, tiny_config)


def run_to_end(generator: Generator, state) -> str:
    while (reason := state.finish_reason(generator.config)) is None:
        generator.step(state)
    return reason


def test_greedy_generation_stops_at_max_tokens(generator):
    state = generator.start(PROMPT, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert run_to_end(generator, state) == "length"
    assert len(state.output_ids) == 5
    again = generator.start(PROMPT, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    run_to_end(generator, again)
    assert again.output_ids == state.output_ids


def test_the_kv_cache_holds_exactly_what_is_fed_back(generator):
    state = generator.start(PROMPT, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert state.cache.max_len == len(PROMPT) + 4
    run_to_end(generator, state)
    assert state.cache.length == state.cache.max_len


def test_generation_stops_at_max_model_len(generator, tiny_config):
    prompt = PROMPT * 5  # 20 of the 24 positions
    state = generator.start(prompt, SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    assert run_to_end(generator, state) == "length"
    assert len(prompt) + len(state.output_ids) == tiny_config.max_model_len


def test_finish_reason_for_eos_and_stop_token_ids(generator):
    state = generator.start(PROMPT, SamplingParams(max_tokens=10, stop_token_ids=[9]))
    assert state.finish_reason(generator.config) is None
    state.output_ids = [5, 9]
    assert state.finish_reason(generator.config) == "stop"
    state.output_ids = [5, generator.config.eos_token_id]
    assert state.finish_reason(generator.config) == "stop"
    state.params.ignore_eos = True
    assert state.finish_reason(generator.config) is None


def test_stepping_a_finished_sequence_is_an_error(generator):
    state = generator.start(PROMPT, SamplingParams(max_tokens=1, seed=3))
    generator.step(state)
    with pytest.raises(RuntimeError):
        generator.step(state)


def test_seeded_sampling_repeats(generator):
    def sample():
        state = generator.start(
            PROMPT, SamplingParams(temperature=1.0, max_tokens=8, seed=123, ignore_eos=True)
        )
        run_to_end(generator, state)
        return state.output_ids

    assert sample() == sample()


@pytest.mark.parametrize(
    ("prompt", "params", "match"),
    [
        ([], SamplingParams(), "prompt"),
        (list(range(24)), SamplingParams(), "prompt"),
        ([3, 64], SamplingParams(), "prompt_ids"),
        (PROMPT, SamplingParams(top_p=0), "top_p"),
        (PROMPT, SamplingParams(stop_token_ids=[64]), "stop_token_ids"),
    ],
)
def test_start_rejects_bad_requests(generator, prompt, params, match):
    with pytest.raises(ValueError, match=match):
        generator.start(prompt, params)


def test_dropping_the_state_frees_its_kv_cache(generator):
    state = generator.start(PROMPT, SamplingParams(max_tokens=4))
    generator.step(state)
    keys = weakref.ref(state.cache.k)
    del state
    gc.collect()
    assert keys() is None
