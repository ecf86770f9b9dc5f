"""Deltas ready together become one per choice: text and logprobs in order,
the finish and running totals of the latest, a broken stream's error last."""

from maas.v1 import engine_pb2
from maas_services.common.openai_api.delta import Delta, merged


def lp(token: str) -> engine_pb2.TokenLogprob:
    return engine_pb2.TokenLogprob(token=token, logprob=-0.5)


def test_one_choice_merges_into_one_delta_with_every_token_logprob():
    deltas = [
        Delta("The", completion_tokens=1, logprobs=[lp("The")]),
        Delta(" cat", completion_tokens=2, logprobs=[lp(" cat")]),
        Delta(" sat", finish_reason="stop", completion_tokens=3, logprobs=[lp(" sat")]),
    ]
    (one,) = merged(deltas)
    assert one.text == "The cat sat"
    assert [entry.token for entry in one.logprobs] == ["The", " cat", " sat"]
    assert (one.finish_reason, one.completion_tokens) == ("stop", 3)


def test_choices_stay_apart_each_in_order():
    deltas = [
        Delta("a", index=0, completion_tokens=1),
        Delta("x", index=1, completion_tokens=2),
        Delta("b", index=0, completion_tokens=3),
        Delta("y", index=1, finish_reason="length", completion_tokens=4),
    ]
    first, second = merged(deltas)
    assert (first.index, first.text, first.finish_reason) == (0, "ab", None)
    assert (second.index, second.text, second.finish_reason) == (1, "xy", "length")
    assert second.completion_tokens == 4


def test_the_text_before_a_broken_stream_is_kept_apart_from_its_error():
    deltas = [Delta("partial"), Delta(" text"), Delta("", finish_reason="error")]
    text, error = merged(deltas)
    assert (text.text, text.finish_reason) == ("partial text", None)
    assert (error.text, error.finish_reason) == ("", "error")


def test_a_lone_delta_is_itself():
    delta = Delta("hi", logprobs=[lp("hi")])
    assert merged([delta]) == [delta]
