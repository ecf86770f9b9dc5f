import pytest

from maas.v1 import engine_pb2
from maas_services.common.openai_api.output_filter import OutputFilter


def run(terms, action, chunks):
    screen = OutputFilter(terms, action).stream()
    out, stopped = [], False
    for i, chunk in enumerate(chunks):
        passed = screen.push(0, chunk, final=i == len(chunks) - 1)
        out.append(passed.text)
        if passed.stopped:
            stopped = True
            break
    return "".join(out), stopped


@pytest.mark.parametrize(
    "chunks",
    [
        ["a darn good day"],
        ["a da", "rn good day"],
        ["a d", "a", "r", "n good day"],
        ["a darn", " good day"],
    ],
)
def test_mask_catches_a_term_however_it_is_split(chunks):
    assert run(["darn"], "mask", chunks) == ("a **** good day", False)


def test_stop_sends_only_the_text_before_the_term():
    assert run(["darn"], "stop", ["all is fine, da", "rn it", " and more"]) == (
        "all is fine, ",
        True,
    )


def test_matching_ignores_case_and_longer_terms_win():
    assert run(["bad", "Bad Word"], "mask", ["a BAD wo", "rd"]) == ("a ********", False)


def test_nothing_is_held_back_at_the_end():
    text, _ = run(["longterm"], "mask", ["short", " end"])
    assert text == "short end"


def test_choices_are_filtered_independently():
    screen = OutputFilter(["darn"], "mask").stream()
    assert screen.push(0, "say da", final=False).text == "say"
    assert screen.push(1, "rn", final=False).text == ""
    assert screen.push(0, "rn", final=True).text == " ****"
    assert screen.push(1, "!", final=True).text == "rn!"


def test_no_terms_means_disabled():
    assert not OutputFilter([], "mask").enabled
    assert not OutputFilter([""], "stop").enabled


def entry(token: str, *alternatives: str) -> engine_pb2.TokenLogprob:
    return engine_pb2.TokenLogprob(
        token=token,
        logprob=-0.5,
        top_logprobs=[engine_pb2.TopLogprob(token=t, logprob=-1.0) for t in alternatives],
    )


def screen_tokens(action, tokens, alternatives=()):
    """Each token its own delta, as the engine sends them; the tokens that came out."""
    screen = OutputFilter(["darn"], action).stream()
    out = []
    for i, token in enumerate(tokens):
        final = i == len(tokens) - 1
        passed = screen.push(0, token, final, [entry(token, *alternatives)])
        out += passed.logprobs
        if passed.stopped:
            break
    return out


def test_masked_terms_vanish_from_logprob_tokens_split_over_tokens():
    out = screen_tokens("mask", ["a", " da", "rn", " day"])
    assert [lp.token for lp in out] == ["a", " **", "**", " day"]
    assert "darn" not in "".join(lp.token for lp in out)


def test_stop_drops_the_entries_from_the_term_on():
    out = screen_tokens("stop", ["all", " fine", " da", "rn", " it"])
    assert [lp.token for lp in out] == ["all", " fine"]


def test_alternatives_that_hold_a_term_are_masked():
    out = screen_tokens("mask", ["fine"], alternatives=["Darn", "dar"])
    assert [t.token for t in out[0].top_logprobs] == ["****", "dar"]
