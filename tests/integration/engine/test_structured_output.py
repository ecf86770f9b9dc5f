"""Grammar-constrained decoding on the real model, driven through LLMEngine.

Greedy and small max_tokens keep it fast; the schemas forbid unbounded
output (benchmarks/structured_schemas.py), so every JSON closes with
finish_reason "stop" well before max_tokens.
"""

import json

import jsonschema
import pytest
from prometheus_client import REGISTRY

from benchmarks.structured_schemas import SCHEMAS
from maas_services.common.grammar.spec import GrammarSpec
from maas_services.engine.llm_engine import RequestRejected
from maas_services.engine.sampling_params import SamplingParams
from tests.integration.engine.test_llm_engine import make_engine, run, tokens

pytestmark = pytest.mark.slow

MAX_TOKENS = 64


def chat(tokenizer, text: str) -> list[int]:
    return tokenizer.encode_chat([{"role": "user", "content": text + " Answer in JSON."}])


def constrained(kind: str, text: str = "", **kw) -> SamplingParams:
    kw.setdefault("temperature", 0)
    return SamplingParams(max_tokens=MAX_TOKENS, grammar=GrammarSpec(kind, text), **kw)


def text_of(outputs) -> str:
    return "".join(out.text for out in outputs)


@pytest.fixture(scope="module")
def engine(model, tokenizer):
    return make_engine(model, tokenizer, max_num_seqs=32, max_num_batched_tokens=512)


FREE = ["Name a river.", "Count to five."]


@pytest.fixture(scope="module")
def twenty(engine, tokenizer):
    """The twenty schemas and two free requests in one batch: (requests, outputs)."""
    requests = {
        f"s{i}": (chat(tokenizer, prompt), constrained("json_schema", json.dumps(schema)))
        for i, (prompt, schema) in enumerate(SCHEMAS)
    }
    free = {
        f"free{i}": (chat(tokenizer, q), SamplingParams(temperature=0, max_tokens=12))
        for i, q in enumerate(FREE)
    }
    return requests, free, run(engine, {**requests, **free})


def test_twenty_schemas_validate_and_free_rows_keep_their_tokens(engine, twenty):
    _, free, got = twenty
    for i, (_, schema) in enumerate(SCHEMAS):
        outputs = got[(f"s{i}", 0)]
        assert outputs[-1].finish_reason == "stop", (i, text_of(outputs))
        jsonschema.validate(json.loads(text_of(outputs)), schema)
    alone = run(engine, free)
    for key in free:
        assert tokens(got[(key, 0)]) == tokens(alone[(key, 0)])


def test_samples_each_follow_the_grammar_with_seeds_and_stop_strings(engine, tokenizer):
    choices = ["yes", "no", "maybe later"]
    prompt = chat(tokenizer, "Will it rain?")
    params = dict(temperature=1.0, seed=7, n=3)
    requests = {
        "choice": (prompt, constrained("choice", json.dumps(choices), **params)),
        # The stop string ends the sample inside the grammar, as without one.
        "regex": (prompt, constrained("regex", "[a-c]{3}-[0-9]{3}x", stop=["-"], **params)),
    }
    first, second = run(engine, requests), run(engine, requests)
    for index in range(3):
        assert text_of(first[("choice", index)]) in choices
        assert first[("choice", index)][-1].finish_reason == "stop"
        regex = text_of(first[("regex", index)])
        assert len(regex) == 3 and set(regex) <= set("abc"), regex
        for key in requests:
            assert tokens(first[(key, index)]) == tokens(second[(key, index)])


def test_speculative_drafts_are_cut_where_the_grammar_forbids(model, tokenizer, engine):
    # A prompt that repeats itself, so the n-gram proposer drafts; its drafts
    # continue the prose, which the schema forbids.
    prompt = chat(tokenizer, "Repeat: the cat sat on the mat, the cat sat on the mat. " * 2)
    schema = {
        "type": "object",
        "properties": {
            "words": {"type": "array", "items": {"enum": ["cat", "mat"]}, "maxItems": 4}
        },
        "required": ["words"],
    }
    plain = run(engine, {"r": (prompt, constrained("json_schema", json.dumps(schema)))})
    spec_engine = make_engine(
        model,
        tokenizer,
        speculative_method="ngram",
        num_speculative_tokens=4,
        speculative_max_batch=8,
    )
    drafted = REGISTRY.get_sample_value("maas_engine_spec_draft_tokens_total") or 0.0
    params = constrained("json_schema", json.dumps(schema), speculative=True)
    spec = run(spec_engine, {"r": (prompt, params)})
    assert REGISTRY.get_sample_value("maas_engine_spec_draft_tokens_total") > drafted
    assert tokens(spec[("r", 0)]) == tokens(plain[("r", 0)])
    jsonschema.validate(json.loads(text_of(spec[("r", 0)])), schema)


def test_preempted_samples_resume_in_their_grammar(model, tokenizer, twenty):
    requests, _, roomy = twenty
    some = {key: requests[key] for key in ["s0", "s4", "s10", "s11"]}
    # Room for little more than the longest alone: the others must be preempted.
    longest = max(len(p) + len(tokens(roomy[(key, 0)])) for key, (p, _) in some.items())
    tiny = make_engine(model, tokenizer, num_blocks=longest // 16 + 3)
    before = REGISTRY.get_sample_value("maas_engine_preemptions_total")
    got = run(tiny, some)
    assert REGISTRY.get_sample_value("maas_engine_preemptions_total") > before
    for key in some:
        assert tokens(got[(key, 0)]) == tokens(roomy[(key, 0)])


@pytest.mark.parametrize(
    ("kind", "text", "problem"),
    [
        ("json_schema", '{"type": "nope"}', "Unsupported type"),
        ("json_schema", "{not json", "not valid JSON"),
        ("regex", "[a-", "Unclosed"),
        ("ebnf", "root ::= undefined_rule", "not defined"),
        ("choice", "[]", "non-empty list"),
    ],
)
def test_an_invalid_grammar_is_refused_before_any_step(engine, tokenizer, kind, text, problem):
    with pytest.raises(RequestRejected, match=problem):
        engine.add_request("bad", chat(tokenizer, "Hi."), constrained(kind, text))
    assert not engine.has_work
