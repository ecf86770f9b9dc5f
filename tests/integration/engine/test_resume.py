"""A migrated request resumed with the tokens its client has: the rest is what one run gives.

For every kind of request a migration must carry over (greedy, seeded,
a stop string split across the cut, a grammar), the run cut after k tokens
and resumed (SamplingParams.resume_ids) streams exactly the tokens and text
the uncut run streams after its first k tokens, and finishes the same way.
"""

import json

import jsonschema
import pytest

from maas_services.common.grammar.spec import GrammarSpec
from maas_services.engine.llm_engine import RequestRejected
from maas_services.engine.sampling_params import SamplingParams
from tests.integration.engine.test_llm_engine import make_engine, run, tokens

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "people": {"type": "integer"}},
    "required": ["city", "people"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(model, tokenizer):
    return make_engine(model, tokenizer)


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:
    return tokenizer.encode_chat([{"role": "user", "content": "Describe Paris in JSON."}])


def text(outputs) -> str:
    return "".join(out.text for out in outputs)


def whole_and_resumed(engine, prompt, params: SamplingParams, cut: int):
    """(the uncut run's outputs, the outputs of the run resumed after `cut` of its tokens)."""
    whole = run(engine, {"whole": (prompt, params)})[("whole", 0)]
    resume = SamplingParams(**{**vars(params), "resume_ids": tokens(whole)[:cut]})
    resumed = run(engine, {"resumed": (prompt, resume)})[("resumed", 0)]
    return whole, resumed


def assert_continues(whole, resumed, cut: int) -> None:
    assert tokens(resumed) == tokens(whole)[cut:]
    # What the client got before the cut plus what the resumed run streams.
    assert text(whole[:cut]) + text(resumed) == text(whole)
    assert resumed[-1].finish_reason == whole[-1].finish_reason
    assert resumed[-1].completion_tokens == whole[-1].completion_tokens


@pytest.mark.parametrize("cut", [1, 9])
def test_a_greedy_run_resumes_where_it_was_cut(engine, prompt, cut):
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    whole, resumed = whole_and_resumed(engine, prompt, params, cut)
    assert_continues(whole, resumed, cut)
    assert resumed[-1].finish_reason == "length"


def test_a_seeded_sample_continues_its_sequence(engine, prompt):
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=16, ignore_eos=True, seed=42)
    whole, resumed = whole_and_resumed(engine, prompt, params, cut=6)
    assert_continues(whole, resumed, cut=6)
    # The seed still decides: another seed draws another sequence.
    other = run(engine, {"o": (prompt, SamplingParams(**{**vars(params), "seed": 7}))})
    assert tokens(other[("o", 0)]) != tokens(whole)


def test_a_stop_string_split_by_the_cut_still_stops(engine, prompt):
    free = run(engine, {"f": (prompt, SamplingParams(temperature=0, max_tokens=16))})[("f", 0)]
    # A stop made of the end of token 5's text and the start of token 6's: the
    # failed replica held token 5's part back, the resumed one must too.
    before, after = free[5].text, free[6].text
    assert before.strip() and after.strip(), [out.text for out in free]
    stop = before[-2:] + after[:2]
    params = SamplingParams(temperature=0, max_tokens=16, stop=[stop])
    whole, resumed = whole_and_resumed(engine, prompt, params, cut=6)
    assert_continues(whole, resumed, cut=6)
    assert whole[-1].finish_reason == "stop" and len(whole) == 7
    assert stop not in text(whole)


def test_a_grammar_constrained_answer_resumes_inside_its_json(engine, prompt):
    params = SamplingParams(
        temperature=0, max_tokens=64, grammar=GrammarSpec("json_schema", json.dumps(SCHEMA))
    )
    whole, resumed = whole_and_resumed(engine, prompt, params, cut=5)
    assert_continues(whole, resumed, cut=5)
    jsonschema.validate(json.loads(text(whole[:5]) + text(resumed)), SCHEMA)


def test_a_resume_that_cannot_be_this_requests_output_is_refused(engine, prompt, tokenizer):
    schema = GrammarSpec("json_schema", json.dumps(SCHEMA))
    not_json = tokenizer.encode("Paris is")
    with pytest.raises(RequestRejected, match="breaks the request's grammar"):
        engine.add_request(
            "g", prompt, SamplingParams(max_tokens=16, grammar=schema, resume_ids=not_json)
        )
    with pytest.raises(RequestRejected, match="resume_ids need n = 1"):
        engine.add_request("n", prompt, SamplingParams(max_tokens=16, n=2, resume_ids=[1]))
    with pytest.raises(RequestRejected, match="resume_ids must be fewer than max_tokens"):
        engine.add_request("m", prompt, SamplingParams(max_tokens=2, resume_ids=[1, 2]))
    assert not engine.requests and not engine.has_work
